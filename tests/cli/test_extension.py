"""The flags a rerun changed, read from two flags.txt records."""
from ssmgate.cli import extension


def test_flag_changes_lists_what_differs_and_reads_old_names_as_the_new_ones():
    old = "--fig1_d=8\n--lr=0.1\n--steps=3\n"
    assert extension.flag_changes(old, "--fig1_d=8\n--lr=0.2\n--steps=3\n") == "--lr: 0.1 -> 0.2"
    assert extension.flag_changes(old, old) == "none"
    record_before_the_rename = "--d=8\n--lr=0.1\n--steps=3\n"
    assert extension.flag_changes(record_before_the_rename, old, {"d": "fig1_d"}) == "none"
    assert extension.flag_changes(record_before_the_rename, old) == "--d: 8 -> <unset>, --fig1_d: <unset> -> 8"
