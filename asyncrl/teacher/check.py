"""The teacher's pre-flight check: what its actors would meet at load, and a tokenizer that is not the student's,
raised before Ray starts (ConfigError naming algorithm.distillation.teacher_path and both folders).

    check_teacher(config, student_tokenizer, student_tokenizer_folder)

Distillation compares the two models' log-probs of the same token ids, so the ids must mean the same text to
both: the vocabularies (token -> id), the special tokens and the end-of-sequence token must be identical. The
teacher may be of another size or family.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config import AsyncRLConfig, ConfigError
from asyncrl.models import check_model_folder, load_tokenizer

KEY = "algorithm.distillation.teacher_path"


def tokenizer_differences(student: Any, teacher: Any) -> list[str]:
    """What differs between two tokenizers, in words (empty when they map text to the same ids)."""
    differences = []
    student_vocab, teacher_vocab = student.get_vocab(), teacher.get_vocab()
    if student_vocab != teacher_vocab:
        changed = sorted(token for token in student_vocab.keys() | teacher_vocab.keys()
                         if student_vocab.get(token) != teacher_vocab.get(token))
        differences.append(f"{len(changed)} token(s) map to other ids or exist in one only "
                           f"(e.g. {', '.join(repr(token) for token in changed[:3])}); vocabularies of "
                           f"{len(student_vocab)} and {len(teacher_vocab)} tokens")
    for name in ("eos_token", "bos_token", "pad_token"):
        if getattr(student, name) != getattr(teacher, name):
            differences.append(f"{name} {getattr(student, name)!r} vs {getattr(teacher, name)!r}")
    return differences


def check_teacher(config: AsyncRLConfig, student_tokenizer: Any, student_tokenizer_folder: str) -> None:
    settings = config.algorithm.distillation
    if not settings.enable:
        return
    if not settings.teacher_path:
        raise ConfigError(f"{KEY} is empty; algorithm.distillation.enable=true needs the teacher's HF folder")
    try:
        teacher_config = check_model_folder(settings.teacher_path, kind="causal_lm")
        teacher_tokenizer = load_tokenizer(settings.teacher_path)
    except ValueError as error:
        raise ConfigError(f"{KEY}: {error}") from None
    differences = tokenizer_differences(student_tokenizer, teacher_tokenizer)
    if differences:
        raise ConfigError(f"{KEY}: the teacher's tokenizer ({settings.teacher_path}) is not the student's "
                          f"({student_tokenizer_folder}): {'; '.join(differences)}. Distillation compares the two "
                          "models on the same token ids: use a teacher trained with the student's tokenizer")
    budget = config.data.max_prompt_length + config.data.max_response_length
    if budget > teacher_config.max_position_embeddings:
        raise ConfigError(f"{KEY}: data.max_prompt_length + data.max_response_length = {budget} exceeds the "
                          f"teacher's max_position_embeddings ({teacher_config.max_position_embeddings}) in "
                          f"{settings.teacher_path}")
    if len(student_tokenizer) > teacher_config.vocab_size:
        raise ConfigError(f"{KEY}: the student's tokenizer has {len(student_tokenizer)} tokens but the teacher "
                          f"{settings.teacher_path} has vocab_size={teacher_config.vocab_size}")
