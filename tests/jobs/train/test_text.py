"""Real text for training (jobs.train.text): packing, the shipped tokenizer, the flags that name a
bad path or vocab in one line, and Ray Data reading parquet, JSON lines and plain text (local, and
from a bucket on the GCS emulator) on the simulated slice into rows of real tokens."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.train import config as train_config
from jobs.train import text

SLICE = ["--generation", "v6e", "--topology", "4x4", "--storage", "/tmp/unused"]


def test_documents_are_packed_with_eos_between_them_and_the_tail_dropped():
    rows = text.pack([[1, 2], [3], [4, 5, 6, 7]], eos=9, row_len=3)
    assert rows.tolist() == [[1, 2, 9], [3, 9, 4], [5, 6, 7]]  # the last EOS, a tail of 1, is dropped
    assert rows.dtype == np.int32
    assert text.pack([[1]], eos=9, row_len=3).shape == (0, 3)


def test_the_shipped_tokenizer_is_what_training_on_the_shipped_corpus_gives():
    docs = text.shipped_documents()
    assert len(docs) > 50 and sum(map(len, docs)) > 50_000
    trained = text.train_tokenizer(docs)
    shipped = text.tokenizer_from_json(text.TOKENIZER.read_text())
    assert json.loads(trained.to_str()) == json.loads(shipped.to_str())
    assert shipped.get_vocab_size() == text.VOCAB
    ids = shipped.encode("A slice must stay whole.").ids
    assert ids[0] == shipped.token_to_id("<s>") and shipped.decode(ids) == "A slice must stay whole."
    assert text.eos_id(shipped, "shipped") == shipped.token_to_id("</s>")


def test_data_flags_set_the_vocab_and_name_a_bad_path_in_one_line(tmp_path, capsys):
    _, config, *_ = train_config.parse_config([*SLICE, "--data", str(text.CORPUS)])
    assert config.model["vocab"] == text.VOCAB and config.tokenizer == str(text.TOKENIZER) and config.data == str(text.CORPUS)
    _, config, *_ = train_config.parse_config([*SLICE, "--data", str(text.CORPUS), "--vocab", "640"])
    assert config.model["vocab"] == 640
    # jobs.submit checks flags on a laptop that may not reach the files: nothing is read there.
    _, config, *_ = train_config.parse_args([*SLICE, "--data", "gs://not-reachable/corpus"])
    assert config.data == "gs://not-reachable/corpus"

    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.jsonl").write_text("{}\n")
    (tmp_path / "mixed" / "b.txt").write_text("x\n")
    (tmp_path / "notes.md").write_text("x\n")
    (tmp_path / "bad.json").write_text("{")
    for argv, message in [
        (["--data", str(tmp_path / "missing")], "argument --data: " + str(tmp_path / "missing") + " does not exist"),
        (["--data", str(tmp_path / "mixed")], "mixes json and text files; use one format per run"),
        (["--data", str(tmp_path / "notes.md")], "must be .parquet, .jsonl, .json, .txt files; found"),
        (["--data", str(text.CORPUS), "--vocab", "300"], "argument --vocab: 300 is smaller than the 512 tokens of --tokenizer"),
        (["--data", str(text.CORPUS), "--tokenizer", str(tmp_path / "bad.json")], "is not a Hugging Face tokenizer.json"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            train_config.parse_config([*SLICE, *argv])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert exit_.value.code == 2 and message in err, err


def test_a_corpus_is_tokenized_once_and_kept_only_when_its_tokens_fit_easily_in_the_object_store():
    store = 4 * 2**30  # a quarter of it: 1 GiB of tokens
    assert text.kept_in_store("json", 256 * 2**20, store)  # at most one int32 token per byte
    assert not text.kept_in_store("json", 257 * 2**20, store)
    assert text.kept_in_store("parquet", 64 * 2**20, store)  # compressed text: up to 4x more
    assert not text.kept_in_store("parquet", 65 * 2**20, store)
    assert not text.kept_in_store("text", 1, 0)  # no object store reported: stream


@pytest.mark.cluster
@pytest.mark.slow  # ~50 s of Ray Data on 2 cores: keeps make test under 12 minutes (the formats' parsing: the pure tests above)
def test_ray_data_reads_each_format_into_rows_of_real_tokens(shared_slice, tmp_path):
    docs = text.shipped_documents()
    pq.write_table(pa.table({"text": docs}), tmp_path / "corpus.parquet")
    (tmp_path / "lines.txt").write_text("\n".join(d.replace("\n", " ") for d in docs) + "\n")
    tok = text.tokenizer_from_json(text.TOKENIZER.read_text())
    seq_len = 64
    got = {}
    for path in (tmp_path / "corpus.parquet", text.CORPUS, tmp_path / "lines.txt"):
        rows = np.concatenate(
            [b["tokens"] for b in text.text_dataset(str(path), str(text.TOKENIZER), seq_len).iter_batches(batch_format="numpy")]
        )
        assert rows.shape[1] == seq_len + 1 and rows.dtype == np.int32
        assert rows.min() >= 0 and rows.max() < text.VOCAB
        got[path.suffix] = rows
    # parquet and JSON lines hold the same documents: the same tokens, in order.
    assert np.array_equal(got[".parquet"], got[".jsonl"])
    expected = text.pack([e.ids for e in tok.encode_batch(docs)], text.eos_id(tok, "shipped"), seq_len + 1)
    assert np.array_equal(got[".jsonl"][: len(expected)], expected[: len(got[".jsonl"])])
    assert tok.decode(got[".jsonl"][0].tolist()).startswith(docs[0][:20])
    assert len(got[".txt"]) > 0.9 * len(got[".jsonl"])  # the same text, one document per line
    # The shipped corpus is small: tokenized once and kept, not re-read every epoch; a corpus
    # streamed instead (too large to keep) gives the same rows.
    kept = text.text_dataset(str(text.CORPUS), str(text.TOKENIZER), seq_len)
    streamed = text.text_dataset(str(text.CORPUS), str(text.TOKENIZER), seq_len, keep=False)
    assert type(kept).__name__ == "MaterializedDataset" and type(streamed).__name__ == "Dataset"
    assert np.array_equal(np.concatenate([b["tokens"] for b in streamed.iter_batches(batch_format="numpy")]), got[".jsonl"])
