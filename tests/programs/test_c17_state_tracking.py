"""protocol §9 check C17 (slow, about 15 minutes on 2 cores): a trained 1-layer Mamba-3 solves parity at
length 224 with the 180-degree phase code, and the no-rotation and static-rotation rows do not.

The model, batch, steps and learning rates are C17's; the curriculum is not. C17 as written (lengths
U{3..40} from step 0) left all 6 native replicas at chance (docs/reproduction.md, P2 Table 2), so
this check holds L_max at 4 for 400 steps and then ramps it to 128, the protocol of
experiments/p2/cpu/state_tracking_parity.flags, with 2 seeds per learning rate.
"""
import pytest

from ssmgate.models import presets
from ssmgate.programs.p2_state_tracking import program as p2
from ssmgate.tasks import state_tracking as st
from ssmgate.train import loop, mesh, optim, sweep
from ssmgate.train.run_spec import Grid, RunSpec

STEPS = 1500


def c17_cfg():
    model = presets.state_tracking("m3_native", 1).replace(d_model=32, d_state=16, headdim=16,
                                                           a_activation="softplus")
    data = st.StateTrackDataCfg(task="parity", batch=128, max_len=128, L_min=3, L_max0=4, L_max1=128,
                                ramp_steps=800, hold_steps=400)
    opt = optim.OptimCfg(name="adamw", lr=3e-3, total_steps=STEPS, warmup_steps=75, final_lr_frac=0.1,
                         b1=0.9, b2=0.95, weight_decay=0.0, clip_norm=1.0)
    spec = RunSpec(model=model, optim=opt, loop=loop.LoopCfg(steps=STEPS, log_every=250, tensorboard=False),
                   mesh=mesh.MeshCfg(), grid=Grid(seeds=2, more_lrs=(1e-2,)), stop=sweep.StopRule("accuracy"))
    return p2.StateTrackingCfg(data=data, spec=spec, models=("underdamped", "m3_norot", "m3_static"), val_n=512,
                               test_n=2048, test_lens=(224,)).validate()


@pytest.mark.slow
def test_c17_trained_rotation_solves_parity_and_the_others_do_not(tmp_path):
    out = p2.run(c17_cfg(), tmp_path)
    scaled = {name: out["scaled_accuracy"][name]["224"] for name in out["models"]}
    assert scaled["underdamped"] >= 90.0, scaled
    assert scaled["m3_norot"] <= 20.0 and scaled["m3_static"] <= 20.0, scaled
    zero_deg, one_deg = out["phase_code"]["deg"]
    assert abs(zero_deg) < 10.0 and abs(abs(one_deg) - 180.0) < 10.0, out["phase_code"]["deg"]
