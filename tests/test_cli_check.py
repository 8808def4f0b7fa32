"""``kernel-attention check`` runs every variant against its reference and reports agreement."""

from kernel_attention.cli import main


def test_check_command_passes(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "all agree" in out
    for name in ["exp", "rbf", "poly", "linear", "periodic", "shaw", "xl", "product", "memory", "strided", "fixed"]:
        assert name in out


def test_each_backend_is_compared_on_a_call_it_runs_or_reported_as_not_checked(capsys):
    """No backend row reads "yes" without a comparison: those that run on the CPU are compared on a call they take
    (banded on Shaw's table, squared on an implicit kernel, linear on the linear kernel), the others say why not."""
    import re
    assert main(["check"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("backend ")}
    for name in ("sdpa", "banded", "squared", "blockwise", "linear", "dense"):
        assert re.search(r"dense backend, .* [0-9.e+-]+  yes$", rows[name]), rows[name]
    assert "shaw" in rows["banded"] and "ikan" in rows["squared"] and "linear +" in rows["linear"]
    for name in ("triton", "flex"):
        if "skipped here:" in rows[name]:
            assert " -   skipped here: " in rows[name]


def test_help_lists_vocabulary(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "kernels:" in out and "positions:" in out and "filters:" in out
