"""p2_lm's training data through the prepared shards: the packer's stream, the cache beside the
.npy streams, reuse without tokenizing, and build_run's global_batch."""
import numpy as np
import pytest

from ssmgate.data import prepare as prep
from ssmgate.train import lm_runs
from ssmgate.programs.p2_lm import program as p2_lm
from ssmgate.config_error import ConfigError
from ssmgate.tasks import text_corpus, text_packing, tokenizers


def test_the_training_stream_is_the_packers_and_is_cached_once(tmp_path, monkeypatch):
    cfg = p2_lm.TextCfg(seq_len=32, batch=4, max_train_tokens=20_000, max_valid_tokens=3_000, max_eval_books=1,
                        cache_dir=str(tmp_path / "cache"))
    data = p2_lm.load_text(cfg, 258)
    want = text_packing.token_stream(text_corpus.embedded_corpus("train"), tokenizers.ByteTokenizer(),
                                     max_tokens=20_000)
    np.testing.assert_array_equal(data.train.read(0, len(data.train)), want)
    assert data.train.directory == tmp_path / "cache" / "embedded_train_byte.shards" and data.scratch is None
    assert (tmp_path / "cache" / "embedded_validation_byte.npy").is_file()  # validation: as before
    monkeypatch.setattr(prep, "tokenize_piece", lambda *a: pytest.fail("a cached prepare tokenized again"))
    assert len(p2_lm.load_text(cfg, 258).train) == 20_000
    with pytest.raises(ConfigError, match=r"--lm_token_cache_dir: .*already prepared with max_tokens=20000 \(not 30000\)"):
        p2_lm.load_text(p2_lm.TextCfg(max_train_tokens=30_000, cache_dir=cfg.cache_dir), 258)


def test_without_a_cache_the_shards_live_in_a_temporary_folder(tmp_path):
    data = p2_lm.load_text(p2_lm.TextCfg(seq_len=32, max_train_tokens=5_000, max_valid_tokens=1_000,
                                         max_eval_books=1), 258)
    folder = data.scratch.name
    assert str(data.train.directory).startswith(folder) and len(data.train) == 5_000
    data.scratch.cleanup()
    assert not (tmp_path / folder).exists()
    with pytest.raises(ConfigError, match="the train split is too short for --seq_len=5000"):
        p2_lm.load_text(p2_lm.TextCfg(seq_len=5_000, max_train_tokens=5_000, max_valid_tokens=6_000), 258)


def test_a_files_corpus_is_a_valid_p2_lm_corpus():
    p2_lm.TextCfg(corpus="files:/data/{split}/*.jsonl#text").validate()
    with pytest.raises(ValueError, match="eval_corpus='files:': expected"):
        p2_lm.TextCfg(eval_corpus="files:").validate()


def test_build_run_takes_exactly_one_data_source_and_global_batch_only_for_single_runs():
    from ssmgate.models.config import ModelCfg
    from ssmgate.train import mesh as meshlib, optim, sweep

    model = ModelCfg(block="mamba3", vocab_size=258, d_model=16, n_layers=1, d_state=8, headdim=8, expand=2)
    mesh = meshlib.make_mesh(meshlib.MeshCfg())
    common = dict(loss=p2_lm.text_loss, eval_batches=[], mesh=mesh, mode="replicated")
    opt = optim.OptimCfg(name="adamw", lr=1e-3, total_steps=2)
    two = (sweep.Replica(seed=0, lr=1e-3), sweep.Replica(seed=1, lr=1e-3))
    with pytest.raises(ValueError, match="global_batch serves single runs"):
        lm_runs.build_run(model, opt, two, global_batch=lambda sharding: None, **common)
    with pytest.raises(ValueError, match="exactly one of sample"):
        lm_runs.build_run(model, opt, two[:1], global_batch=lambda s: None, host_sample=lambda s, k: None, **common)
    seen = []
    run = lm_runs.build_run(model, opt, two[:1], global_batch=lambda s: seen.append(s) or (lambda k: k), **common)
    assert run.batch_fn(7) == 7 and seen[0].spec[0] == "data"
