"""`python -m engine generate --prompt "..." [options]`: a quick look at the engine from the shell."""

from __future__ import annotations

import argparse
import sys

from engine.api import LLM
from engine.config import MODES, EngineConfig
from engine.params import SamplingParams


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate from one prompt and print acceptance stats")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--mode", choices=MODES, default="sync")
    gen.add_argument("--num-speculative-tokens", "-k", type=int, default=3)
    gen.add_argument("--draft-loops", type=int, default=2)
    gen.add_argument("--dtype", default="float32")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--num-samples", "-n", type=int, default=1)
    return root


def generate(args: argparse.Namespace) -> int:
    config = EngineConfig(
        mode=args.mode,
        dtype=args.dtype,
        draft_loops=args.draft_loops,
        num_speculative_tokens=args.num_speculative_tokens,
    )
    params = [
        SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            max_tokens=args.max_tokens,
            seed=None if args.seed is None else args.seed + i,
        )
        for i in range(args.num_samples)
    ]
    llm = LLM(config)
    outputs = llm.generate([args.prompt] * args.num_samples, params)
    for output in outputs:
        print(f"--- seed={output.seed} finish={output.finish_reason} rounds={output.num_rounds}")
        print(args.prompt + llm.tokenizer.decode(output.token_ids))
    drafts = sum(o.num_draft_tokens for o in outputs)
    accepted = sum(o.num_accepted_tokens for o in outputs)
    tokens = sum(len(o.token_ids) for o in outputs)
    rounds = sum(o.num_rounds for o in outputs)
    rate = f"{accepted / drafts:.3f}" if drafts else "n/a"
    print(
        f"=== mode={args.mode} tokens={tokens} rounds={rounds} drafts={drafts} "
        f"accepted={accepted} acceptance_rate={rate} tokens_per_round={tokens / max(rounds, 1):.2f}"
    )
    llm.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return generate(args)
    except (ValueError, NotImplementedError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
