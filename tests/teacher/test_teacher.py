"""The distillation teacher: its log-probs are the trainer's forward of the same tokens, its actors split a batch
in order, a teacher past its deadline or dead fails only its rows (counted), and a teacher whose tokenizer is not
the student's is refused before Ray starts, naming both folders; a queued sample's teacher scores survive a
fully-async checkpoint."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.config.distillation_schema import DistillationConfig
from asyncrl.core.records import Sample
from asyncrl.data.make import make_task, write_task
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.models import build_tiny_model, load_model, load_tokenizer
from asyncrl.recipes.fully_async.state_codec import encode_state, load_state
from asyncrl.teacher import TeacherModel, TeacherPool, TeacherScore, check_teacher
from asyncrl.teacher.records import ERROR, TIMEOUT
from tests.e2e.test_user_errors import assert_clean_failure, train_cli
from tests.rewards.test_reward_models import ready_after_restart

ROWS = [(np.array([1, 7, 8], dtype=np.int32), np.array([9, 10], dtype=np.int32)),
        (np.array([1, 7], dtype=np.int32), np.array([11, 12, 13, 2], dtype=np.int32)),
        (np.array([1, 9, 9, 9], dtype=np.int32), np.array([14], dtype=np.int32))]


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("teacher") / "model", seed=3)


def forward_log_probs(folder, prompt, response, temperature):
    """log_softmax(logits / temperature) of each response token, by a plain forward of the whole row."""
    model = load_model(folder)
    ids = torch.tensor([[*prompt.tolist(), *response.tolist()]])
    hidden = model(ids, torch.arange(ids.shape[1])[None])
    logits = hidden[0] @ model.lm_head.weight.T / temperature                        # (T, V)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return log_probs[positions, torch.as_tensor(response, dtype=torch.long)].detach().numpy()


def test_the_teachers_log_probs_are_a_plain_forward_of_the_same_tokens_at_the_students_temperature(teacher_folder):
    scores = TeacherModel(str(teacher_folder), temperature=0.7, micro_batch_size=2).score(ROWS)
    assert [len(score) for score in scores] == [2, 4, 1]
    for (prompt, response), score in zip(ROWS, scores):
        assert score.dtype == np.float32
        np.testing.assert_allclose(score, forward_log_probs(teacher_folder, prompt, response, 0.7), atol=1e-5)


def test_the_pool_splits_rows_over_real_actors_in_order_and_counts_a_timeout_and_a_dead_actor(ray_session,
                                                                                              teacher_folder):
    config = load_config(None, [f"algorithm.distillation.teacher_path={teacher_folder}", "model.path=unused",
                                "algorithm.distillation.num_workers=2", "algorithm.distillation.num_cpus_per_worker=0.05",
                                "rollout.temperature=0.7"])
    pool = TeacherPool.launch(config)
    try:
        assert len(set(pool.wait_ready(timeout_s=120))) == 2
        pending = pool.start(ROWS)
        assert pending.shares == [(0, 1), (1, 3)]
        local = TeacherModel(str(teacher_folder), temperature=0.7).score(ROWS)
        scores = pool.collect(pending)
        for score, expected in zip(scores, local):
            assert score.is_scored and score.failure == ""
            np.testing.assert_allclose(score.log_probs, expected, atol=1e-5)   # other padding, other threads
        # A deadline already past when the results are collected: every row fails as a timeout, nothing raises.
        pool.config = DistillationConfig(enable=True, teacher_path=str(teacher_folder), timeout_s=1e-6)
        late = pool.collect(pool.start(ROWS))
        assert [score.failure for score in late] == [TIMEOUT] * 3 and not any(score.is_scored for score in late)
        assert "teacher/replica" in late[0].message
        pool.config = DistillationConfig(enable=True, teacher_path=str(teacher_folder), timeout_s=120)
        ready_after_restart(pool)   # an actor past its deadline is restarted, to take the next call at once
        ray_session.kill(pool.actors[1], no_restart=True)
        died = pool.collect(pool.start(ROWS))
        assert died[0].is_scored and [score.failure for score in died[1:]] == [ERROR, ERROR]
        assert "teacher/replica1" in died[1].message
    finally:
        for actor in pool.actors:
            ray_session.kill(actor)


def swapped_tokenizer_copy(folder, target):
    """A copy of `folder` whose tokenizer gives the ids of 'a' and 'b' to each other: same size, other ids."""
    shutil.copytree(folder, target)
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    return target


def test_a_teacher_with_another_tokenizer_is_refused_naming_both_folders(teacher_folder, tmp_path):
    student = build_tiny_model(tmp_path / "student", seed=1)
    other = swapped_tokenizer_copy(teacher_folder, tmp_path / "other_teacher")
    config = load_config(None, [f"model.path={student}", "algorithm.distillation.enable=true",
                                f"algorithm.distillation.teacher_path={other}"])
    with pytest.raises(ConfigError) as refused:
        check_teacher(config, load_tokenizer(student), str(student))
    message = str(refused.value)
    assert "algorithm.distillation.teacher_path" in message and str(other) in message and str(student) in message
    assert "1 token" not in message and "2 token(s)" in message
    # Another family or size with the same tokenizer is a teacher; an empty path is named.
    bigger = build_tiny_model(tmp_path / "bigger", family="llama", hidden_size=96, num_layers=3)
    check_teacher(load_config(None, [f"model.path={student}", "algorithm.distillation.enable=true",
                                     f"algorithm.distillation.teacher_path={bigger}"]),
                  load_tokenizer(student), str(student))
    with pytest.raises(ConfigError, match="algorithm.distillation.teacher_path is empty"):
        check_teacher(load_config(None, [f"model.path={student}", "algorithm.distillation.enable=true"]),
                      load_tokenizer(student), str(student))


def test_asyncrl_train_refuses_the_teacher_before_ray_starts(teacher_folder, tmp_path):
    """The refusal as a user meets it: `asyncrl train` exits with one line naming the key and both folders."""
    student = build_tiny_model(tmp_path / "student", seed=1)
    other = swapped_tokenizer_copy(teacher_folder, tmp_path / "other_teacher")
    data = write_task(make_task("arithmetic", {"max_digits": "1"}), tmp_path / "data", 16, 2, seed=0)
    result = train_cli(f"model.path={student}", f"data.train_files=[{data['train']}]", "data.max_prompt_length=16",
                       "data.max_response_length=4", "algorithm.distillation.enable=true",
                       f"algorithm.distillation.teacher_path={other}", f"trainer.output_dir={tmp_path / 'run'}")
    assert_clean_failure(result, "algorithm.distillation.teacher_path", f"({other})", f"({student})")
    assert not (tmp_path / "run").exists()   # refused before the run folder was written


def test_a_queued_samples_teacher_scores_survive_a_fully_async_checkpoint(tmp_path):
    """The rollouter queues samples with the teacher's log-probs; a checkpoint holds them as data and gives them
    back bit for bit (a failed score too), so a resumed run does not ask the teacher again."""
    record = PromptRecord("p0", [{"role": "user", "content": "1+1"}], "test", "2")
    result = GenerationResult("epoch0/p0/0", np.array([1, 7], dtype=np.int32), np.array([9, 2], dtype=np.int32),
                              np.array([-0.5, -0.1], dtype=np.float32), np.zeros(2, dtype=np.int32), "stop")
    scored = TeacherScore(np.array([-0.25, -0.125], dtype=np.float32))
    samples = [Sample(TokenizedPrompt(record, [1, 7]), 0, 0, result, score=1.0, teacher=scored),
               Sample(TokenizedPrompt(record, [1, 7]), 0, 1, result, score=0.0,
                      teacher=TeacherScore.failed(TIMEOUT, "teacher/replica0: score did not answer within 1s"))]
    for name, data in encode_state({"queue": [samples]}).items():
        (tmp_path / name).write_bytes(data)
    restored = load_state(tmp_path)["queue"][0]
    np.testing.assert_array_equal(restored[0].teacher.log_probs, scored.log_probs)
    assert restored[1].teacher == samples[1].teacher and not restored[1].teacher.is_scored
