"""``kernel-attention check`` runs every variant against its reference and reports agreement."""

from kernel_attention.cli import main


def test_check_command_passes(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "all agree" in out
    for name in ["exp", "rbf", "poly", "linear", "periodic", "shaw", "xl", "product", "memory", "strided", "fixed"]:
        assert name in out


def test_help_lists_vocabulary(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "kernels:" in out and "positions:" in out and "filters:" in out
