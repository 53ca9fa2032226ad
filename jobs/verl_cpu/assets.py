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

``--learn`` makes the ``cpu-learn`` preset's assets instead (``LEARN``): sums of 0-2, 7 in 10
of them with the sum 2, and a warm start on the format alone, every answer drawn at random from
the task's sums. The model
then writes ``#### N`` with a number that has nothing to do with the question (its reward is
chance, about a fifth), so whatever the reward gains in the run, verl's GRPO gained it.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Task:
    """What the assets teach: sums of operands 0..``max_operand``, and a warm start of
    ``warm_start_steps`` on answers right for ``right_share`` of them and drawn at random from
    the task's sums for the rest (0: the format without the task)."""

    max_operand: int = 3
    warm_start_steps: int = 0
    warm_start_lr: float = 3e-3
    # The share of warm-start answers that are right; the others are drawn at random from the
    # task's sums (1: the answers, 0: the format alone).
    right_share: float = 1.0
    # The share of questions whose sum is ``favoured`` (the rest drawn evenly): an answer that
    # pays more than the others, which a policy learns before it learns to add.
    favoured_share: float = 0.0
    favoured: int = 2


SMOKE = Task()
LEARN = Task(
    max_operand=2,
    warm_start_steps=300,
    warm_start_lr=1e-3,
    right_share=0.0,
    favoured_share=0.7,
)


def problem(rng: random.Random, task: Task = SMOKE) -> tuple[str, str]:
    top = task.max_operand
    if task.favoured_share and rng.random() < task.favoured_share:
        a = rng.randint(max(0, task.favoured - top), min(top, task.favoured))
        b = task.favoured - a
    else:
        a, b = rng.randint(0, top), rng.randint(0, top)
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


def make_tokenizer(
    corpus: list[str],
    out: Path,
    vocab: int = VOCAB,
    chat_template: str = CHAT_TEMPLATE,
    added: tuple[str, ...] = (),
) -> Any:
    """A byte-level BPE tokenizer of ``vocab`` trained on ``corpus`` with ChatML's specials,
    ``added`` as whole (not special) tokens after it, saved to ``out``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",  # noqa: S106 - a token of the vocabulary, not a secret
        pad_token="<|endoftext|>",  # noqa: S106
        bos_token=None,
        chat_template=chat_template,
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


def warm_start(
    model: Any, tokenizer: Any, rows: list[dict[str, Any]], steps: int, task: Task = SMOKE
) -> list[float]:
    """``steps`` of supervised training on prompt -> ``#### N<|im_end|>`` (loss on the answer):
    N the answer for ``task.right_share`` of them, else a sum of the task drawn at random."""
    import torch

    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    sums = range(2 * task.max_operand + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=task.warm_start_lr)
    model.train()
    losses = []
    for _ in range(steps):
        batch = rng.sample(rows, 16)
        ids, labels = [], []
        for r in batch:
            prompt = tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True,
                                                   tokenize=False)  # fmt: skip
            p = tokenizer(prompt)["input_ids"]
            right = rng.random() < task.right_share
            answer = r["reward_model"]["ground_truth"] if right else rng.choice(sums)
            a = tokenizer(f"#### {answer}<|im_end|>")["input_ids"]
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


def make(
    out_dir: str | Path, warm_start_steps: int = 0, task: Task | None = None
) -> dict[str, Any]:
    """Write the model, tokenizer and data under ``out_dir``; a summary of what was written.
    ``task`` (default: the smoke run's, with ``warm_start_steps``) says what they teach."""
    import pandas as pd

    task = task or Task(warm_start_steps=warm_start_steps)
    out = Path(out_dir)
    model_dir, data_dir = out / "model", out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    splits = {"train": TRAIN_ROWS, "test": TEST_ROWS}
    rows = {s: [row(*problem(rng, task), s, i) for i in range(n)] for s, n in splits.items()}
    # The tokenizer is the smoke task's whatever the task: BPE's merges follow its corpus, and
    # on another corpus "#### N" splits otherwise than the chat text around it.
    smoke = random.Random(SEED)
    corpus = [q + f" #### {a}" for q, a in (problem(smoke) for _ in range(TRAIN_ROWS))]
    corpus.append("user assistant system\n")
    tokenizer = make_tokenizer(corpus, model_dir)
    model = make_model(tokenizer, model_dir)
    losses = warm_start(model, tokenizer, rows["train"], task.warm_start_steps, task)
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
        "max_operand": task.max_operand,
        "warm_start_steps": task.warm_start_steps,
        "warm_start_right_share": task.right_share,
        "warm_start_loss": [round(losses[0], 4), round(losses[-1], 4)] if losses else None,
        "bytes": sizes,
    }
    (out / "assets.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("dir")
    parser.add_argument("--warm-start-steps", type=int, default=0)
    parser.add_argument("--learn", action="store_true", help="the cpu-learn preset's assets")
    args = parser.parse_args()
    summary = make(args.dir, task=LEARN) if args.learn else make(args.dir, args.warm_start_steps)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
