"""The smoke run's model, tokenizer and data, made here (no hub needed), the same bytes each time.

``python -m jobs.verl_cpu.assets DIR [--warm-start-steps N]`` (or ``rlrun verl
make-smoke-assets DIR``) writes:

- ``DIR/model``: a Qwen2 of random weights (vocab 400, hidden 128, 2 layers, 2 heads of dim 64,
  one KV head, tied embeddings, float32), with its tokenizer: byte-level BPE trained here with
  ``tokenizers`` (byte-level, so the chat template's ``\\n`` is one token as verl's Qwen path
  expects; head dim 64 and float32 because vLLM's CPU attention refuses 16 and bfloat16 dies
  with SIGILL on some CPUs);
- ``DIR/data/{train,test}.parquet``: sums of small numbers in verl's RL format, with
  ``data_source: openai/gsm8k`` so that verl's built-in rule reward scores them (1.0 for an
  exact ``#### N``, else 0).

Random weights never write ``#### N``: every reward is 0, GRPO's advantages are 0, and the run
proves the path, not learning. ``--warm-start-steps`` first trains the model briefly on the
answer format (supervised, same seed), which gives mixed rewards within groups and so real
policy-gradient updates.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

SEED = 1234
VOCAB = 400
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAIN_ROWS, TEST_ROWS = 256, 16
MAX_OPERAND = 3


def problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
    return f"What is {a} + {b}? End with #### and the number.", str(a + b)


def row(question: str, answer: str, split: str, index: int) -> dict[str, Any]:
    """One row in verl's RL parquet format (as verl's gsm8k preprocessing writes it)."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": f"#### {answer}"},
    }


def make_tokenizer(corpus: list[str], out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",  # noqa: S106 - a token of the vocabulary, not a secret
        pad_token="<|endoftext|>",  # noqa: S106
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)
    return fast


def make_model(tokenizer: Any, out: Path) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    return Qwen2ForCausalLM(config).to(torch.float32)


def warm_start(model: Any, tokenizer: Any, rows: list[dict[str, Any]], steps: int) -> list[float]:
    """``steps`` of supervised training on prompt -> ``#### N<|im_end|>`` (loss on the answer)."""
    import torch

    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for _ in range(steps):
        batch = rng.sample(rows, 16)
        ids, labels = [], []
        for r in batch:
            prompt = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True,
                                                   tokenize=False)  # fmt: skip
            p = tokenizer(prompt)["input_ids"]
            a = tokenizer(f"#### {r['reward_model']['ground_truth']}<|im_end|>")["input_ids"]
            ids.append(p + a)
            labels.append([-100] * len(p) + a)
        width = max(len(x) for x in ids)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        label_t = torch.tensor([x + [-100] * (width - len(x)) for x in labels])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        loss = model(input_ids=input_ids, attention_mask=mask, labels=label_t).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def make(out_dir: str | Path, warm_start_steps: int = 0) -> dict[str, Any]:
    """Write the model, tokenizer and data under ``out_dir``; a summary of what was written."""
    import pandas as pd

    out = Path(out_dir)
    model_dir, data_dir = out / "model", out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    splits = {"train": TRAIN_ROWS, "test": TEST_ROWS}
    rows = {s: [row(*problem(rng), s, i) for i in range(n)] for s, n in splits.items()}
    corpus = [r["prompt"][0]["content"] + f" #### {r['reward_model']['ground_truth']}"
              for r in rows["train"]] + ["user assistant system\n"]  # fmt: skip
    tokenizer = make_tokenizer(corpus, model_dir)
    model = make_model(tokenizer, model_dir)
    losses = warm_start(model, tokenizer, rows["train"], warm_start_steps)
    model.save_pretrained(model_dir, safe_serialization=True)
    for split, items in rows.items():
        pd.DataFrame(items).to_parquet(data_dir / f"{split}.parquet", index=False)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    for path in files:  # the cluster may run jobs as another user; save_pretrained writes 0600
        path.chmod(0o644)
    sizes = {str(p.relative_to(out)): p.stat().st_size for p in files}
    summary = {
        "model": str(model_dir),
        "train_files": str(data_dir / "train.parquet"),
        "val_files": str(data_dir / "test.parquet"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "warm_start_steps": warm_start_steps,
        "warm_start_loss": [round(losses[0], 4), round(losses[-1], 4)] if losses else None,
        "bytes": sizes,
    }
    (out / "assets.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("dir")
    parser.add_argument("--warm-start-steps", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(make(args.dir, args.warm_start_steps), indent=2))


if __name__ == "__main__":
    main()
