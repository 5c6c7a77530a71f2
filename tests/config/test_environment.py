"""What a config asks of the driver's machine fails before Ray starts: trainer.device=cuda without a CUDA
device (unless the workers run on a cluster that may have one), and a trainer.resume folder that does not exist
or is not a checkpoint. The machine is faked, so the tests decide the same on a GPU host."""

import re

import pytest
import torch

from asyncrl.config import ConfigError, check_environment, load_config


@pytest.fixture()
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_cuda_on_a_driver_without_a_device_fails_naming_the_key_and_the_reason(no_cuda):
    with pytest.raises(ConfigError, match=r"^trainer\.device=cuda, but this machine has no CUDA device that torch "
                                          r"can use \(torch\.cuda\.is_available\(\) is False: no GPU, or its driver is "
                                          r"not loaded\); use trainer\.device=cpu \(or auto: cuda where available\), "
                                          r"or set ray\.address to a cluster whose nodes have GPUs$"):
        check_environment(load_config(None, ["trainer.device=cuda"]))


def test_the_reason_names_a_cpu_build_of_torch_or_hidden_devices(no_cuda, monkeypatch):
    config = load_config(None, ["trainer.device=cuda"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match=r"\(CUDA_VISIBLE_DEVICES='' hides every device\)"):
        check_environment(config)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match=rf"\(torch {re.escape(torch.__version__)} is built without CUDA\)"):
        check_environment(config)


def test_a_cluster_may_have_the_gpus_the_driver_lacks(no_cuda):
    check_environment(load_config(None, ["trainer.device=cuda", "ray.address=10.0.0.1:6379"]))
    check_environment(load_config(None, ["trainer.device=cuda"]), has_ray_cluster=True)
    check_environment(load_config(None, ["trainer.device=auto"]))
    check_environment(load_config(None, ["trainer.device=cpu"]))


def test_cuda_on_a_driver_with_a_device_passes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_environment(load_config(None, ["trainer.device=cuda"]))


def test_a_resume_folder_that_does_not_exist_fails_before_ray(tmp_path):
    missing = tmp_path / "run" / "checkpoints" / "step_7"
    with pytest.raises(ConfigError, match=rf"^trainer\.resume: checkpoint folder {re.escape(str(missing))} does not "
                                          r"exist; give an existing one \(<trainer\.output_dir>/checkpoints/step_N\), "
                                          r"auto to resume from the newest under trainer\.output_dir, or disable$"):
        check_environment(load_config(None, [f"trainer.resume={missing}", "trainer.device=cpu"]))


def test_a_resume_path_that_is_a_file_or_a_folder_of_checkpoints_is_named(tmp_path):
    file = tmp_path / "driver.json"
    file.write_text("{}")
    with pytest.raises(ConfigError, match=rf"^trainer\.resume: {re.escape(str(file))} is a file, not a checkpoint "
                                          r"folder"):
        check_environment(load_config(None, [f"trainer.resume={file}", "trainer.device=cpu"]))
    root = tmp_path / "checkpoints"
    for step in (2, 10, 4):
        (root / f"step_{step}").mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"^trainer\.resume: {re.escape(str(root))} holds checkpoints \(step_2, "
                                          rf"step_4, step_10\) rather than being one; give one of them, e\.g\. "
                                          rf"trainer\.resume={re.escape(str(root / 'step_10'))}$"):
        check_environment(load_config(None, [f"trainer.resume={root}", "trainer.device=cpu"]))
    check_environment(load_config(None, [f"trainer.resume={root / 'step_4'}", "trainer.device=cpu"]))


def test_auto_and_disable_need_no_folder(tmp_path):
    for setting in ("auto", "disable"):
        check_environment(load_config(None, [f"trainer.resume={setting}", f"trainer.output_dir={tmp_path / 'none'}",
                                             "trainer.device=cpu"]))


def test_loading_a_config_does_not_look_at_the_machine(no_cuda, tmp_path):
    """`asyncrl config show` of a GPU config with a resume folder prints it on a laptop."""
    config = load_config(None, ["trainer.device=cuda", f"trainer.resume={tmp_path / 'elsewhere'}"])
    assert (config.trainer.device, config.trainer.resume) == ("cuda", str(tmp_path / "elsewhere"))
