"""Parts of the user's own by name in configs: ``run.imports`` imports the modules that register them, for every
command that reads the config, a checkpoint's stored one included."""

import sys

import pytest
import torch
import yaml

import kernel_attention as ka
from kernel_attention.cli import main
from kernel_attention.config import ConfigError
from kernel_attention.extensions import import_extensions
from kernel_attention.reference import smoother_loop

MODULE = '''
import torch.nn.functional as F
import kernel_attention as ka


@ka.KERNELS.register("test-cosine", [ka.Param("temperature", float, 0.1, check=lambda t: t > 0, rule="> 0")])
class CosineKernel(ka.Kernel):
    """exp(cos(a, b) / temperature)."""
    name = "test-cosine"

    def __init__(self, temperature: float = 0.1):
        super().__init__()
        self.temperature = temperature

    def log_kernel(self, q, k):
        return F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2) / self.temperature
'''

CONFIG = {
    "task": {"name": "synthetic", "kind": "copy", "vocab": 5, "min_len": 2, "max_len": 3, "batch_size": 8,
             "train_size": 16, "valid_size": 8, "test_size": 8},
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
              "encoder_attention": {"kernel": "test-cosine:temperature=0.2"}},
    "train": {"max_steps": 1, "progress": False},
}


@pytest.fixture
def cosine_module(tmp_path, monkeypatch):
    """my_kernels.py in a fresh working directory; the kernel it registers is gone again afterwards."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_kernels.py").write_text(MODULE)
    yield tmp_path
    ka.KERNELS._entries.pop("test-cosine", None)
    for name in [m for m in sys.modules if m == "my_kernels" or m.startswith("kernel_attention_extension_my_")]:
        del sys.modules[name]


def test_a_config_trains_and_a_checkpoint_loads_with_the_kernel_its_module_registers(cosine_module, capsys):
    (cosine_module / "run.yaml").write_text(yaml.safe_dump({"run": {"imports": ["my_kernels"]}, **CONFIG}))
    assert main(["train", "run.yaml", "--run-dir", "run"]) == 0
    loaded = ka.load("run")
    kernel = loaded.model.encoder[0].self_attn.kernel
    assert type(kernel).__name__ == "CosineKernel" and kernel.temperature == 0.2
    q, k, v = torch.randn(3, 1, 2, 5, 4, dtype=torch.float64).unbind(0)
    cos = torch.nn.functional.cosine_similarity
    ref = smoother_loop(q, k, v, lambda a, b: torch.exp(cos(a, b, dim=0) / 0.2))
    torch.testing.assert_close(ka.attention(q, k, v, kernel=kernel), ref)


def test_a_file_by_path_is_imported_once(cosine_module):
    assert import_extensions("my_kernels.py") == import_extensions(["my_kernels.py"])
    assert "test-cosine" in ka.KERNELS
    import_extensions("my_kernels")   # the same file under its module name: the same class, no clash
    with pytest.raises(ValueError, match=r"kernel 'test-cosine' is registered twice \(my_kernels.CosineKernel and "):
        ka.KERNELS.register("test-cosine")(type("CosineKernel", (ka.Kernel,), {}))


@pytest.mark.parametrize("imports, message", [
    ("nowhere", r"run.imports: no module 'nowhere' in the current directory \(.*\) or on the Python path"),
    ("nowhere.py", r"run.imports: nowhere.py is no file"),
    ([3], r"run.imports must be a module name or a .py file, or a list of them, got \[3\]"),
])
def test_a_module_that_is_not_there_is_named(tmp_path, monkeypatch, imports, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        import_extensions(imports)


def test_a_missing_dependency_of_the_module_is_its_own_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "needs_more.py").write_text("import no_such_dependency\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        import_extensions("needs_more")


def test_check_names_a_part_of_your_own_as_not_checked(cosine_module, capsys):
    import_extensions("my_kernels")
    assert main(["check"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kernel    test-cosine"))
    assert "a part of your own (registered outside the library): no reference here" in row
