"""Configuration errors and refusals through the entry point: one line on stderr (no absl usage
text before it), exit status 2, and no run directory left behind by a run that was refused before
it wrote anything. Also the sweep's progress line once a replica has diverged."""
import json

import numpy as np
import pytest

from ssmgate.interventions import convert_mamba3 as cv
from ssmgate.train import loop
from tests.main_runs import run_many

TINY = ["--program=train", "--block=mamba2", "--vocab_size=16", "--d_model=16", "--n_layers=1", "--d_state=8",
        "--headdim=8", "--batch=4", "--seq_len=9", "--task=copy", "--tensorboard=false", "--lr=5e-3"]
NO_WANDB = """
import importlib.util
real = importlib.util.find_spec
mp.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
"""


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    (root / "corpus" / "train").mkdir(parents=True)
    (root / "corpus" / "train" / "empty.txt").write_text("")
    official = root / "ckpt"
    official.mkdir()
    (official / "config.json").write_text(json.dumps({"d_model": "64", "ssm_cfg": {"layer": "Mamba3"}}))
    cases = {  # name: (arguments, patch, the one line expected on stderr)
        "range": ([*TINY, "--steps=2", "--d_model=-3"], None, "[ssmgate] --d_model=-3: expected an integer >= 1"),
        "unknown": ([*TINY, "--steps=2", "--d_modle=3"], None, "Unknown command line flag 'd_modle'"),
        "wandb": ([*TINY, "--steps=2", "--wandb_project=p"], NO_WANDB,
                  "[ssmgate] --wandb_project=p needs the wandb package (pip install wandb)"),
        "mesh": ([*TINY, "--steps=2", "--mesh_data=2"], None, "--mesh_data=2"),
        "empty_split": (["--flagfile=experiments/p2/quick/lm_rope0.flags", f"--lm_corpus=files:{root}/corpus/{{split}}/*.txt"],
                        None, f"[ssmgate] --lm_corpus=files:{root}/corpus/{{split}}/*.txt: the train split is empty "
                              "(1 parts, 0 bytes of text)"),
        "no_split": (["--flagfile=experiments/p2/quick/lm_rope0.flags", f"--lm_corpus=files:{root}/none/{{split}}/*.txt"],
                     None, f"no file matches the glob '{root}/none/train/*.txt'"),
        "official": (["--flagfile=experiments/p2/interventions_official_siso.flags", f"--lm_init_official={official}",
                      "--lm_official_ppl=10"], None, "config.json d_model='64' is a string; expected an integer"),
        "lr0_first": ([*TINY, "--steps=2", "--opt_final_lr_frac=0"], None, None),
        "lr0_extend": ([*TINY, "--steps=4", "--opt_final_lr_frac=0"], None,
                       "extends a run whose schedule ends at lr 0 (--opt_final_lr_frac=0)"),
    }
    dirs = {name: root / (name if not name.startswith("lr0") else "lr0") for name in cases}
    results = run_many([[*args, f"--run_dir={dirs[name]}"] for name, (args, _, _) in cases.items()],
                       patches=[patch for _, patch, _ in cases.values()])
    return {name: (dirs[name], expected, res) for (name, (_, _, expected)), res in zip(cases.items(), results)}


@pytest.mark.parametrize("name", ["range", "unknown", "wandb", "mesh", "empty_split", "no_split", "official",
                                  "lr0_extend"])
def test_a_refusal_is_one_line_with_status_2_and_leaves_no_new_run_dir(refusals, name):
    run_dir, expected, res = refusals[name]
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and expected in lines[0], (res.returncode, res.stderr[-3000:])
    if name == "lr0_extend":
        assert refusals["lr0_first"][2].returncode == 0 and "--steps=2" in (run_dir / "flags.txt").read_text()
    else:
        assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


def test_an_official_config_of_the_wrong_json_types_is_named():
    for config, expected in [({"ssm_cfg": [1]}, "ssm_cfg=[1] is an array; expected an object"),
                             ({"ssm_cfg": {"layer": "Mamba3", "d_state": 16.5}}, "ssm_cfg.d_state=16.5 is a number; "
                                                                                  "expected an integer"),
                             ({"tie_embeddings": "yes"}, "tie_embeddings='yes' is a string; expected true or false")]:
        with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            cv.config_from_upstream(config)


def test_a_sweep_progress_line_shows_the_finite_replicas_and_counts_the_others():
    metrics = {"loss": np.array([0.5, np.nan, 0.25]), "accuracy": np.array([np.nan, np.nan, np.nan]),
               "grad_norm": np.float32(1.5)}
    assert loop._short(metrics) == "loss 0.25..0.5 (1 of 3 not finite), accuracy nan (3 of 3 not finite), grad_norm 1.5"
