"""The Hugging Face tokenizer files a model directory ships (what transformers and vLLM's OpenAI
server read), and the special tokens and chat template of the repo's own tokenizers (the one
`jobs.train.text` ships and the tiny serving model's)."""

from __future__ import annotations

import json

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (UNK, BOS, EOS, *ROLE_TOKENS)
EOS_TOKENS = (EOS, "<|endoftext|>", "<|end_of_text|>", "<eos>")  # the end-of-text names tokenizers use

# A chat template in the role tokens (the chat endpoint needs one)...
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# ...and one in plain text, for a tokenizer without them.
PLAIN_CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def train_byte_bpe(texts, vocab_size: int, min_frequency: int = 2):
    """A byte-level BPE (`tokenizers`) of at most `vocab_size` tokens with SPECIAL_TOKENS, trained on
    `texts`, that puts BOS first as a prompt's (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)])
    return tok


def eos_token_id(tokenizer) -> int | None:
    """The id of the tokenizer's end-of-text token, or None when it has none of EOS_TOKENS."""
    for token in EOS_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return None


def tokenizer_files(tokenizer, model_max_length: int) -> dict[str, str]:
    """The files for a `tokenizers.Tokenizer` that has an end-of-text token: BOS is what its post
    processor puts first (if anything), EOS its end-of-text token; the chat template uses its role
    tokens where it has them."""
    eos_id = eos_token_id(tokenizer)
    if eos_id is None:
        raise ValueError(f"the tokenizer has none of the end-of-text tokens {', '.join(EOS_TOKENS)}")
    eos = tokenizer.id_to_token(eos_id)
    first = tokenizer.encode("").ids
    bos = tokenizer.id_to_token(first[0]) if first else None
    has_roles = all(tokenizer.token_to_id(t) is not None for t in ROLE_TOKENS)
    template = CHAT_TEMPLATE if has_roles else PLAIN_CHAT_TEMPLATE
    special = {**({"bos_token": bos} if bos else {}), "eos_token": eos, "pad_token": eos}
    if tokenizer.token_to_id(UNK) is not None:
        special["unk_token"] = UNK
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "add_bos_token": bos is not None,
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
        **special,
    }
    return {
        "tokenizer.json": tokenizer.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
        "chat_template.jinja": template + "\n",
    }
