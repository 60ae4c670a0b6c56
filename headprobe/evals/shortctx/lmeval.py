"""``HeadprobeLM``: any headprobe model (our checkpoints, local Hugging Face models) behind
lm-evaluation-harness' ``LM`` interface, offline."""

from __future__ import annotations

from pathlib import Path

import torch

from headprobe.evals.shortctx.scoring import loglikelihoods, token_logprobs
from headprobe.hooked import HookedModel, load_model


def _lm_base():
    try:
        from lm_eval.api.model import LM
    except ImportError:  # lm-eval not installed: a plain base class keeps the adapter importable
        return object
    return LM


class HeadprobeLM(_lm_base()):  # type: ignore[misc]
    """lm-evaluation-harness ``LM`` over a headprobe model: ``lm_eval.simple_evaluate(model=HeadprobeLM(path),
    tasks=[...])`` runs any of its tasks on our checkpoints (or local HF models) offline."""

    def __init__(
        self,
        path: str | Path | None = None,
        model: HookedModel | None = None,
        device: str = "cpu",
        batch_size: int = 8,
    ) -> None:
        if model is None and path is None:
            raise ValueError("give a checkpoint path or a loaded model")
        if _lm_base() is not object:
            super().__init__()
        if model is None:
            model = load_model(path, device=device)  # type: ignore[arg-type]
        self.hooked = model
        self.batch_size = max(1, int(batch_size))

    @staticmethod
    def _args(request) -> tuple:
        return tuple(request.args) if hasattr(request, "args") else tuple(request)

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        return loglikelihoods(self.hooked, [self._args(r)[:2] for r in requests], self.batch_size)

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Log-likelihood of each whole text (token by token from the start, one window)."""
        out = []
        for r in requests:
            text = self._args(r)[0]
            ids = self.hooked.encode_prompt(text)
            if not self.hooked.prompt_start:  # no BOS: condition the first token on end-of-text
                eos = self.hooked.tokenizer.eos_id
                ids = [eos if eos is not None else ids[0], *ids]
            logp = token_logprobs(self.hooked, ids)
            target = torch.tensor(ids[1:], device=logp.device)
            out.append(float(logp[:-1].gather(-1, target[:, None]).sum()))
        return out

    def generate_until(self, requests) -> list[str]:
        """Greedy continuations cut at the first ``until`` string; requests with the same
        ``max_gen_toks`` decode together, ``batch_size`` at a time (:meth:`HookedModel.decode_batch`)."""
        tok = self.hooked.tokenizer
        stop = [tok.eos_id] if tok.eos_id is not None else None
        args = [self._args(r)[:2] for r in requests]
        out = [""] * len(args)
        groups: dict[int, list[int]] = {}
        for i, (_, kwargs) in enumerate(args):
            groups.setdefault(int(kwargs.get("max_gen_toks", 256)), []).append(i)
        for max_new, members in groups.items():
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                prompts = [torch.tensor([self.hooked.encode_prompt(args[i][0])]) for i in chunk]
                for i, new in zip(chunk, self.hooked.decode_batch(prompts, max_new, stop), strict=True):
                    until = args[i][1].get("until", []) or []
                    text = tok.decode(new)
                    for s in [until] if isinstance(until, str) else until:
                        text = text.split(s)[0]
                    out[i] = text
        return out
