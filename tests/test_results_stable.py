"""`make reproduce` writes byte-identical files on a rerun: the writers it shares, checked cheaply."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def experiments():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import _report
        import reproduce
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return _report, reproduce


def test_a_figure_saved_twice_is_the_same_bytes_without_metadata(experiments, tmp_path):
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    _report, _ = experiments
    out = []
    for name in ("a.png", "b.png"):
        fig, ax = plt.subplots(figsize=(2, 1.5), layout="constrained")
        ax.plot([0, 1, 2], [0.1 + 0.2, 0.5, 1.0], "o-")
        assert _report.save_figure(fig, tmp_path / name, dpi=50) == name
        assert not plt.fignum_exists(fig.number)  # closed
        out.append((tmp_path / name).read_bytes())
    assert out[0] == out[1]
    assert b"Software" not in out[0] and b"matplotlib" not in out[0].lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]  # no temporary left behind


def test_a_csv_written_twice_is_the_same_bytes(experiments, tmp_path):
    _report, _ = experiments
    rows = [["x", np.float64(2 / 3), 0.1 + 0.2, float("inf"), 3]]
    _report.write_csv(tmp_path / "a.csv", ["s", "f", "g", "h", "i"], rows)
    _report.write_csv(tmp_path / "b.csv", ["s", "f", "g", "h", "i"], [["x", 2 / 3, 0.3, np.inf, np.int64(3)]])
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_text() == "s,f,g,h,i\nx,0.6666666667,0.3,inf,3\n"


def _sections(_report):
    secs = []
    for i, title in enumerate(("First | one", "Second", "Third")):
        s = _report.Section(title=title, source=f"paper {i}", notes="a note" if i else "")
        s.rows.append(_report.Row(f"item {i} a|b", "1", "1", "matches"))
        s.rows.append(_report.Row(f"item {i}", "x | y", "z", "differs: x | y" if i == 1 else "shape matches"))
        s.figures.append(f"fig{i}.png")
        s.timings["step"] = 1.0 + i  # never written into the report
        secs.append(s)
    return secs


def test_only_keeps_the_other_sections_byte_for_byte(experiments, tmp_path):
    _report, reproduce = experiments
    secs = _sections(_report)
    full = reproduce.assemble(secs)
    assert "step" not in full and "1.0" not in full
    (tmp_path / "report.md").write_text(full, encoding="utf-8")
    earlier = reproduce.earlier_sections(tmp_path / "report.md")
    assert list(earlier) == [s.title for s in secs]
    # the middle section rerun, the others kept as they were: the same report, headline counts included
    spliced = [reproduce.KeptSection(secs[0].title, earlier[secs[0].title]), secs[1],
               reproduce.KeptSection(secs[2].title, earlier[secs[2].title])]
    assert reproduce.assemble(spliced) == full
    assert [r.verdict for r in spliced[0].rows] == ["matches", "shape matches"]
    assert "Rows: 6; matches: 3; shape matches: 2; differs: 1; failed: 0." in full


def test_only_refuses_an_unknown_module_before_running_anything(experiments, tmp_path, capsys):
    _, reproduce = experiments
    with pytest.raises(SystemExit) as exc:
        reproduce.main(["--out", str(tmp_path / "out"), "--only", "no_such"])
    assert exc.value.code == 2
    assert "--only: no module named no_such" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_roundoff_columns_and_report_errors_hide_summation_noise(experiments, tmp_path):
    _report, _ = experiments
    header = ["name", "err", "value"]
    _report.write_csv(tmp_path / "a.csv", header, [["x", 1.1e-16, 2.5e-17], ["y", -3e-17, 0.5]], roundoff=("err",))
    _report.write_csv(tmp_path / "b.csv", header, [["x", 0.0, 2.5e-17], ["y", 2e-14 - 2e-14, 0.5]], roundoff=("err",))
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_text() == "name,err,value\nx,0,2.5e-17\ny,0,0.5\n"  # other columns as they are
    with pytest.raises(ValueError, match="`roundoff` names columns not in the header: \\['nope'\\]"):
        _report.write_csv(tmp_path / "c.csv", header, [], roundoff=("nope",))
    assert not (tmp_path / "c.csv").exists()
    assert {_report.fmt_error(x) for x in (0.0, 4.4e-16, -7.6e-17)} == {"below 1e-13"}
    assert _report.fmt_error(4.9e-9) == "4.9e-09" and _report.fmt_error(-2.5e-3) == "-2.5e-03"


def test_a_maximum_at_noise_level_has_no_location(experiments):
    # "largest gap 0.0000 at k = 1" on one machine and "at k = 6" on another: a zero-to-rounding maximum
    # is reported as no gap, whatever the summation order put where
    _report, _ = experiments
    ks = [1, 2, 4, 6]
    a = _report.fmt_argmax([0.0, 3e-17, -1e-16, 4e-17], ks, what="gap", at="k")
    b = _report.fmt_argmax([2e-16, 0.0, 0.0, -5e-17], ks, what="gap", at="k")
    assert a == b == "no gap (every value below 1e-13 in magnitude)"
    assert _report.fmt_argmax([0.01, 0.25, 0.25 - 1e-15, 0.1], ks, what="gap", at="k") == "largest gap 0.2500 at k = 2"
    assert _report.fmt_argmax([-0.5, -0.1, -0.2, -0.3], ks, what="gap", at="k") == "largest gap -0.1000 at k = 2"
