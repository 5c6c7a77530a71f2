"""The demo's setup cache: data and warm-started model made once per task and settings, reused after."""

import json
from dataclasses import replace

from asyncrl.config import load_config
from asyncrl.data import demo_tasks
from asyncrl.launch import demo

TINY = demo_tasks.DemoTask(summary="a tiny setup for tests", task="arithmetic", knobs=demo_tasks.TASK_KNOBS,
                           train_size=64, val_size=16, sft_epochs=1.0,
                           model_shape={**demo_tasks.MODEL_SHAPE, "hidden_size": 32})


def model_bytes(setup):
    return (setup.model / "model.safetensors").read_bytes()


def test_a_setup_is_reused_while_its_settings_hold_and_rebuilt_when_they_change(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(demo_tasks.DEMO_TASKS, "tiny", TINY)
    first = demo.prepare_setup(tmp_path, "tiny")
    assert first.folder == tmp_path / "setup" / "tiny"
    assert first.train_file.is_file() and first.val_file.is_file() and (first.model / "config.json").is_file()
    assert json.loads((first.folder / "setup.json").read_text()) == demo.setup_settings(TINY, 0)
    made = model_bytes(first)
    capsys.readouterr()

    again = demo.prepare_setup(tmp_path, "tiny")
    assert again == first and model_bytes(again) == made
    assert "reusing the data and warm-started model" in capsys.readouterr().out

    monkeypatch.setitem(demo_tasks.DEMO_TASKS, "tiny", replace(TINY, sft_epochs=2.0))  # another warm start
    changed = demo.prepare_setup(tmp_path, "tiny")
    assert "SFT warm start (2.0 epochs)" in capsys.readouterr().out
    assert json.loads((changed.folder / "setup.json").read_text())["sft"]["epochs"] == 2.0
    assert model_bytes(changed) != made

    demo.prepare_setup(tmp_path, "tiny", rebuild=True)
    assert "SFT warm start" in capsys.readouterr().out


def test_a_variant_continues_from_its_base_and_is_keyed_by_the_base_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(demo_tasks.DEMO_TASKS, "tiny", TINY)
    tailed = replace(TINY, knobs={**TINY.knobs, "tail_median": "4", "tail_cap": "8"}, warm_start_from="tiny")
    monkeypatch.setitem(demo_tasks.DEMO_TASKS, "tiny_tail", tailed)
    setup = demo.prepare_setup(tmp_path, "tiny_tail")
    out = capsys.readouterr().out
    assert "starting from the tiny demo's warm-started model" in out
    assert (tmp_path / "setup" / "tiny" / "setup.json").is_file()  # the base was made on the way
    assert json.loads((setup.folder / "setup.json").read_text())["warm_start_from"]["demo"] == "tiny"
    monkeypatch.setitem(demo_tasks.DEMO_TASKS, "tiny", replace(TINY, sft_epochs=2.0))  # the base changes: so does the variant
    demo.prepare_setup(tmp_path, "tiny_tail")
    assert capsys.readouterr().out.count("SFT warm start") == 2


def test_a_lora_demo_runs_in_a_folder_of_its_own(tmp_path):
    plain = load_config(demo.demo_config_path(), [])
    lora = load_config(demo.demo_config_path(), ["model.lora_rank=8"])
    assert demo.run_folder(tmp_path, "arithmetic", "sync", plain) == tmp_path / "arithmetic-sync"
    assert demo.run_folder(tmp_path, "arithmetic", "sync", lora) == tmp_path / "arithmetic-sync-lora"
    assert demo.run_folder(tmp_path, "tools", "fully_async", lora) == tmp_path / "tools-fully_async-lora"
