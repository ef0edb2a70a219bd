"""The table of docs/hugging-face.md, "Every model type": each causal-LM model type of the
installed transformers, what ``grouped_from_hf`` / ``latent_from_hf`` do with it, and what proves
it. Generated from the tests, never written by hand:

- "exact": a case of tests/parity/test_hf_models.py or test_hf_latent.py builds that model type
  and proves the converted layer exact against transformers' module (named in the row);
- "refused": ``numpy_attention.hf.refused.REFUSED`` or ``latent.REFUSED`` holds its reason, which
  ``grouped_from_hf`` raises (tests/numpy_attention/hf/test_refused.py);
- "no reason yet": neither, so the converter gives its generic message (a row to write);
- the types out of scope (encoders, encoder-decoders, decoders released before 2023, speech and
  image models) are listed by kind under the table, as ``OUT_OF_SCOPE`` names them.

``python -m tests.docs.hf_table`` rewrites the table in place; tests/docs/test_hf_table.py
fails when the committed table is not what this module generates.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "hugging-face.md"
BEGIN, END = "<!-- hf-table: begin (python -m tests.docs.hf_table) -->", "<!-- hf-table: end -->"

OUT_OF_SCOPE = {
    "encoders and encoder-decoders (their decoders cross-attend)": (
        "bart bert bert-generation big_bird bigbird_pegasus blenderbot blenderbot-small camembert "
        "data2vec-text electra ernie marian mbart megatron-bert mvp pegasus plbart prophetnet "
        "rembert roberta roberta-prelayernorm roc_bert roformer trocr whisper xlm xlm-roberta "
        "xlm-roberta-xl xlnet xmod"
    ),
    "decoders released before 2023": (
        "biogpt bloom codegen cpmant ctrl gpt-sw3 gpt2 gpt_neo gpt_neox gpt_neox_japanese gptj "
        "openai-gpt opt reformer xglm"
    ),
    "speech, music and image models": "git got_ocr2 fuyu moshi moss_transcribe_diarize musicgen "
    "musicgen_melody",
}


def _model_type(prefix: str) -> str:
    import transformers

    return str(getattr(transformers, f"{prefix}Config").model_type)


def proven_exact() -> dict[str, list[str]]:
    """model_type -> the names of the parity cases that build it."""
    from tests.parity import test_hf_latent, test_hf_models

    cases: dict[str, list[str]] = {}
    for case in test_hf_models.CASES:
        cases.setdefault(_model_type(case.model), []).append(case.name)
    for case in test_hf_latent.CASES:
        prefix = "Kimi_K25" if case.model == "Kimi_K25" else case.model
        cases.setdefault(_model_type(prefix), []).append(case.name)
    return cases


def rows() -> list[str]:
    """The table's lines."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from numpy_attention.hf import latent
    from numpy_attention.hf.refused import REFUSED

    out = {name for names in OUT_OF_SCOPE.values() for name in names.split()}
    exact = proven_exact()
    types = sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - out | set(exact))
    lines = ["| model type | result | proven by, or the reason |", "|---|---|---|"]
    for name in types:
        if name in exact:
            cell = ", ".join(f"`{case}`" for case in exact[name])
            lines.append(f"| `{name}` | exact | {cell} |")
        elif name in REFUSED or name in latent.REFUSED:
            reason = REFUSED.get(name) or latent.REFUSED[name]
            reason = re.sub(r"^\S+: ", "", reason).replace("|", "\\|")
            lines.append(f"| `{name}` | refused | {reason} |")
        else:
            lines.append(f"| `{name}` | no reason yet | the converter's generic message |")
    counts = {kind: sum(f"| {kind} |" in line for line in lines) for kind in ("exact", "refused")}
    lines.append("")
    lines.append(
        f"{len(types)} model types: {counts['exact']} exact, {counts['refused']} refused by name, "
        f"{len(types) - sum(counts.values())} without a reason yet. Out of scope:"
    )
    for kind, names in OUT_OF_SCOPE.items():
        lines.append(f"- {kind}: {', '.join(f'`{n}`' for n in names.split())}.")
    return lines


def section(text: str) -> str:
    """What stands between the markers of ``text``."""
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:stop].strip("\n")


def main() -> int:
    text = DOC.read_text()
    table = "\n".join(rows())
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(f"{text[:start]}\n{table}\n{text[stop:]}")
    print(f"{DOC}: {len(table.splitlines())} lines between the markers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
