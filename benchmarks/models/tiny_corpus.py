"""Build the measuring models' corpus and tokenizer (CPU): real offline text, a BPE trained on it.

Documents: the Python standard library's ``.py`` files (no test packages, no site-packages) of
the running interpreter, and the reStructuredText sources of the Python documentation
(``_sources/**/*.rst.txt`` of Debian's ``python3.11-doc``, extracted with ``dpkg -x``). Held out
(never trained on): the ``asyncio``, ``email``, ``json`` and ``xml`` packages and their library
documentation pages. Tokenizer: byte-level BPE (HF ``tokenizers``), ``VOCAB`` ids, digits split
one per token, ``EOS`` between documents. Output under ``--out``: ``train.npy`` and
``heldout.npy`` (uint16 token ids, documents joined by EOS in path order), ``manifest.json``
(file counts, bytes, tokens, sha256 of both arrays); the tokenizer under ``--tokenizer``.
With ``--reuse-tokenizer`` the tokenizer already at ``--tokenizer`` encodes the documents and is
left as it is: the committed models' ids whatever the interpreter's patch release (a BPE trained on
another release's standard library differs), so a later training stage reads the same vocabulary.

    apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb /tmp/pydoc
    python benchmarks/models/tiny_corpus.py --docs /tmp/pydoc --out .corpus --tokenizer benchmarks/models/tokenizer
    python benchmarks/models/tiny_corpus.py --docs /tmp/pydoc --out .corpus --tokenizer benchmarks/models/tokenizer \\
        --reuse-tokenizer   # a corpus for the committed models
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sysconfig
from pathlib import Path

import numpy as np

VOCAB = 8192
EOS = "<|endoftext|>"
HELD_OUT = ("asyncio", "email", "json", "xml")


def stdlib_documents(root: Path) -> list[tuple[str, str]]:
    """(name, text) of the standard library's .py files under ``root``, test packages excluded."""
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if {"site-packages", "test", "tests", "idle_test"} & set(rel.parts):
            continue
        docs.append((f"stdlib/{rel.as_posix()}", path.read_text(encoding="utf-8", errors="replace")))
    return docs


def doc_documents(root: Path) -> list[tuple[str, str]]:
    """(name, text) of the documentation's reST sources found under ``root``."""
    sources = sorted(root.rglob("_sources/**/*.rst.txt"))
    if not sources:
        raise SystemExit(f"--docs: no _sources/**/*.rst.txt under {root} (extract python3.11-doc there)")
    base = sources[0].parents[len(sources[0].relative_to(root).parts) - 1]
    return [(f"docs/{p.relative_to(base).as_posix()}", p.read_text(encoding="utf-8", errors="replace"))
            for p in sources]


def held_out(name: str) -> bool:
    """Whether a document belongs to the held-out split (by package or library page name)."""
    parts = name.split("/")
    if parts[0] == "stdlib":
        return parts[1].removesuffix(".py") in HELD_OUT
    page = parts[-1].removesuffix(".rst.txt")
    return "library" in parts and any(page == m or page.startswith(m + "-") or page.startswith(m + ".")
                                      for m in HELD_OUT)


def train_tokenizer(texts: list[str]):
    """A byte-level BPE of ``VOCAB`` ids over ``texts``, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS,
                                   model_max_length=1 << 20)


def encode(tokenizer, docs: list[tuple[str, str]]) -> np.ndarray:
    """Token ids of the documents joined by EOS, uint16."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids = tokenizer([text for _, text in docs], add_special_tokens=False)["input_ids"]
    out = []
    for row in ids:
        out.extend(row)
        out.append(eos)
    return np.asarray(out, dtype=np.uint16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, required=True, help="python3.11-doc extracted with dpkg -x")
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--reuse-tokenizer", action="store_true",
                        help="encode with the tokenizer at --tokenizer instead of training one")
    args = parser.parse_args()
    for flag in ("docs", "stdlib"):
        if not getattr(args, flag).is_dir():
            parser.error(f"--{flag}: {getattr(args, flag)} is not a directory")
    if args.reuse_tokenizer and not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--reuse-tokenizer: {args.tokenizer} holds no tokenizer.json")
    docs = stdlib_documents(args.stdlib) + doc_documents(args.docs)
    train = [d for d in docs if not held_out(d[0])]
    heldout = [d for d in docs if held_out(d[0])]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reuse_tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = train_tokenizer([text for _, text in train])
        tokenizer.save_pretrained(args.tokenizer)
    manifest = {"vocab": VOCAB, "eos": EOS, "held_out": HELD_OUT}
    for split, split_docs in (("train", train), ("heldout", heldout)):
        ids = encode(tokenizer, split_docs)
        np.save(args.out / f"{split}.npy", ids)
        manifest[split] = {"documents": len(split_docs), "bytes": sum(len(t.encode()) for _, t in split_docs),
                           "tokens": int(ids.size), "sha256": hashlib.sha256(ids.tobytes()).hexdigest()}
        print(split, manifest[split])
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
