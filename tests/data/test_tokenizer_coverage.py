"""The share of prompt characters a tokenizer cannot represent is measured at load, by an encode -> decode
round trip, and warned about above a threshold with the file, an example row and the characters lost."""

from __future__ import annotations

import logging
import re
from collections import Counter

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from asyncrl.data import read_prompt_file
from asyncrl.data.coverage import measure_coverage
from asyncrl.data.dataset import PromptDataset
from asyncrl.models import load_tokenizer, save_char_tokenizer

from .helpers import data_config, row, write_jsonl


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(save_char_tokenizer(tmp_path_factory.mktemp("tokenizer")))


def test_characters_outside_the_vocabulary_are_counted_with_an_example(tokenizer, tmp_path):
    rows = [row("1+1="), row("caf\u00e9 \u00e9t\u00e9\r\n", system="Be brief."), row("2+2\u00a0=")]
    records = read_prompt_file(write_jsonl(tmp_path / "p.jsonl", rows))
    coverage = measure_coverage(tokenizer, records)
    # 4 + (9 + 10) + 5 characters; lost: é x3 and \r in row 1, the no-break space in row 2.
    assert (coverage.num_chars, coverage.num_lost_chars, coverage.num_prompts_affected) == (28, 5, 2)
    assert coverage.lost_fraction == pytest.approx(5 / 28)
    assert coverage.example_prompt_id == "p.jsonl:1"
    assert coverage.example_lost == Counter({"\u00e9": 3, "\r": 1})
    assert coverage.describe() == "p.jsonl:1 loses '\u00e9' x3, '\\r' x1 in 'caf\u00e9 \u00e9t\u00e9\\r\\n'"


def test_characters_a_tokenizer_drops_without_an_unknown_token_are_counted(tmp_path):
    """A BPE model without unk_token leaves unknown characters out: the round trip still sees them go."""
    vocab = {character: index for index, character in enumerate("0123456789+=")}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    dropping = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert dropping.encode("1 + 1", add_special_tokens=False) == [1, 10, 1]
    records = read_prompt_file(write_jsonl(tmp_path / "p.jsonl", [row("1 + 1 ="), row("2+2=")]))
    coverage = measure_coverage(dropping, records)
    assert (coverage.num_chars, coverage.num_lost_chars, coverage.num_prompts_affected) == (11, 3, 1)
    assert coverage.example_lost == Counter({" ": 3})


def test_above_the_threshold_a_warning_names_the_file_and_an_example_row(tokenizer, tmp_path, caplog):
    path = write_jsonl(tmp_path / "french.jsonl", [row("1+1="), row("d\u00e9j\u00e0 vu")])
    caplog.set_level(logging.INFO, logger="asyncrl")
    dataset = PromptDataset.from_files([str(path)], tokenizer, data_config())
    assert len(dataset) == 2 and dataset.coverage.num_lost_chars == 2
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].getMessage() == (
        f"{path}: tokenizer {tokenizer.name_or_path} cannot represent 18.2% of the prompt characters (2 of 11, in "
        "1 of 2 prompts; they become its unknown token or vanish): e.g. french.jsonl:1 loses '\u00e9' x1, "
        "'\u00e0' x1 in 'd\u00e9j\u00e0 vu'. Use a tokenizer that covers the data, or clean the data (warned above "
        "data.max_unrepresentable_char_fraction=0.01)")


def test_at_or_below_the_threshold_it_is_only_logged_at_info(tokenizer, tmp_path, caplog):
    path = write_jsonl(tmp_path / "p.jsonl", [row("1+1="), row("d\u00e9j\u00e0 vu")])
    caplog.set_level(logging.INFO, logger="asyncrl")
    PromptDataset.from_files([str(path)], tokenizer, data_config("data.max_unrepresentable_char_fraction=0.2"))
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert re.search(r"cannot represent 18\.2% of the prompt characters", caplog.text)
    caplog.clear()
    PromptDataset.from_files([str(write_jsonl(tmp_path / "ascii.jsonl", [row("1 +\t1\n=")]))], tokenizer,
                             data_config())
    assert "cannot represent" not in caplog.text
