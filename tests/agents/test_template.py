"""The template bridge renders only the environment's tokens, and refuses templates it cannot bridge, naming
the tokenizer."""

from __future__ import annotations

import pytest

from asyncrl.models import build_tiny_model, load_tokenizer
from asyncrl.rollout.agent.template import TemplateError, ToolTurnRenderer, truncate_tokens

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|endoftext|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture()
def tokenizer(tmp_path):
    return load_tokenizer(build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1))


def test_the_tiny_template_renders_consecutive_results_in_one_turn(tokenizer):
    ids = ToolTurnRenderer(tokenizer).render([{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    assert tokenizer.decode(ids) == "<|user|><tool_response>1</tool_response><tool_response>2</tool_response><|assistant|>"


def test_a_chatml_style_template_gives_the_newline_after_eos_to_the_environment(tokenizer):
    tokenizer.chat_template = CHATML
    ids = ToolTurnRenderer(tokenizer).render([{"role": "tool", "content": "408"}])
    assert tokenizer.decode(ids) == "\n<|im_start|>tool\n408<|endoftext|>\n<|im_start|>assistant\n"


def test_a_template_without_a_tool_role_is_refused_naming_the_tokenizer(tokenizer):
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool') }}"
                               "{% endif %}{{ m['content'] + '<|endoftext|>' }}{% endfor %}")
    with pytest.raises(TemplateError, match=f"tokenizer {tokenizer.name_or_path} cannot render.*no tool"):
        ToolTurnRenderer(tokenizer)


def test_a_template_that_does_not_end_turns_with_eos_is_refused(tokenizer):
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    with pytest.raises(TemplateError, match="does not end an assistant turn with the EOS token"):
        ToolTurnRenderer(tokenizer)


@pytest.mark.parametrize("side, expected", [("left", [3, 4, 5]), ("right", [0, 1, 2]), ("middle", [0, 1, 5])])
def test_truncation_sides(side, expected):
    assert truncate_tokens(list(range(6)), 3, side) == expected
    assert truncate_tokens([1, 2], 3, side) == [1, 2]
