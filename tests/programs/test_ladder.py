"""The scale ladder of docs/reproduction.md: every row not reproduced at the largest scale, with what each
scale measured."""
import json
from pathlib import Path

from ssmgate import ladder as ladder_cli
from ssmgate.programs import registry
from ssmgate.report import claims, ladder

REPO = Path(__file__).resolve().parents[2]
COMMITTED = json.loads((REPO / "docs" / "reproduction" / "summary.json").read_text())
ROWS = registry.claim_rows()


def test_rows_not_reproduced_at_the_largest_scale():
    quick = {"p1_fig1": {"checks": {"fig1a_crossing_alpha0_in_[0.15,0.21]": False}}}
    table = ladder.markdown({"quick": quick, "cpu": COMMITTED}, ROWS)
    cpu_rows = claims.rows(COMMITTED, ROWS)
    listed = [k for k, r in cpu_rows.items() if r["status"] != "reproduced"]
    assert listed and all(f"| {k} |" in table for k in listed)
    assert not any(f"| {k} |" in table for k, r in cpu_rows.items() if r["status"] == "reproduced")
    assert table.startswith("| artefact | ours (quick) | ours (cpu) |")
    row = ladder.rows({"quick": quick, "cpu": COMMITTED}, ROWS)
    assert all(len(r) == 3 and r[2].endswith(f"({cpu_rows[r[0]]['status']})") for r in row)


def test_command_line(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(COMMITTED))
    assert ladder_cli.main([f"cpu={path}"]) == 0 and "| artefact | ours (cpu) |" in capsys.readouterr().out
    assert ladder_cli.main(["cpu"]) == 2 and ladder_cli.main([f"cpu={tmp_path / 'missing.json'}"]) == 2
