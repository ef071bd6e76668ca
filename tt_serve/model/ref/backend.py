"""TorchBackend: the reference implementation of the Backend protocol (CPU, or CUDA)."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from tt_serve.model.interface import StateCopy, StepBatch, StepOutput
from tt_serve.model.ref.model import HybridModel
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.ref.pools import Pools
from tt_serve.model.spec import ModelSpec
from tt_serve.model.weights import load_weights, resolve_dtype


class TorchBackend:
    """Runs ``StepBatch``es on torch tensors; owns the KV pool and GDN state/snapshot slots.

    Greedy tokens are chosen on the device (argmax) and only the ids cross to the host; logits
    leave the device only for rows that ask for them (host sampling).
    """

    def __init__(
        self,
        spec: ModelSpec,
        weights: dict[str, torch.Tensor],
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype)
        cast = {
            n: t if n.endswith(("A_log", "dt_bias")) else t.to(self.dtype)
            for n, t in weights.items()
        }
        self.model = HybridModel(spec, cast, self.device)
        self.pools: Pools | None = None

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, device: str | torch.device = "cpu", dtype: str = "float32"
    ) -> TorchBackend:
        """Load a checkpoint folder (config.json + safetensors) in ``dtype`` (float32 | bfloat16)."""
        spec = ModelSpec.from_hf_dir(path)
        tdtype = resolve_dtype(dtype)
        return cls(spec, load_weights(path, spec, dtype=tdtype), device=device, dtype=tdtype)

    def allocate(
        self,
        *,
        num_kv_blocks: int,
        block_size: int,
        num_state_slots: int,
        num_snapshot_slots: int,
    ) -> None:
        self.pools = Pools.allocate(
            self.spec,
            num_kv_blocks=num_kv_blocks,
            block_size=block_size,
            num_state_slots=num_state_slots,
            num_snapshot_slots=num_snapshot_slots,
            dtype=self.dtype,
            device=self.device,
        )

    def _pools(self) -> Pools:
        if self.pools is None:
            raise RuntimeError("TorchBackend.allocate() must be called before execute()")
        return self.pools

    def execute(self, batch: StepBatch) -> StepOutput:
        pools = self._pools()
        rows = batch.rows
        with torch.no_grad():
            plan = StepPlan.build(batch, pools.block_size, self.device)
            hidden = self.model.hidden_states(plan, pools)
            sampled = [i for i, r in enumerate(rows) if r.sample]
            out = StepOutput(token_ids=[None] * len(rows), logprobs=[None] * len(rows))
            if not sampled:
                return out
            idx = plan.last_tokens[torch.tensor(sampled, device=self.device)]
            logits = self.model.logits(hidden[idx])  # [R, vocab] fp32
            greedy = [j for j, i in enumerate(sampled) if not rows[i].want_logits]
            host = [j for j, i in enumerate(sampled) if rows[i].want_logits]
            if host:
                host_logits = logits[torch.tensor(host, device=self.device)].cpu().numpy()
                for n, j in enumerate(host):
                    out.logits[sampled[j]] = host_logits[n]
            if greedy:
                g = logits[torch.tensor(greedy, device=self.device)]
                chosen = g.argmax(dim=-1)
                for j, tok in zip(greedy, chosen.tolist(), strict=True):
                    out.token_ids[sampled[j]] = int(tok)
                k = max(rows[sampled[j]].top_logprobs for j in greedy)
                if k > 0:
                    self._logprobs(out, g, chosen, [sampled[j] for j in greedy], batch, k)
            return out

    def _logprobs(
        self,
        out: StepOutput,
        logits: torch.Tensor,
        chosen: torch.Tensor,
        row_ids: list[int],
        batch: StepBatch,
        k: int,
    ) -> None:
        lp = torch.log_softmax(logits, dim=-1)
        chosen_lp = lp.gather(1, chosen[:, None])[:, 0].tolist()
        top_v, top_i = lp.topk(min(k, lp.shape[-1]), dim=-1)
        top_v_l, top_i_l, chosen_l = top_v.tolist(), top_i.tolist(), chosen.tolist()
        for n, r in enumerate(row_ids):
            want = batch.rows[r].top_logprobs
            if want <= 0:
                continue
            d = {int(chosen_l[n]): float(chosen_lp[n])}
            for t, v in zip(top_i_l[n][:want], top_v_l[n][:want], strict=True):
                d.setdefault(int(t), float(v))
            out.logprobs[r] = d

    def execute_all_logits(self, batch: StepBatch) -> list[torch.Tensor]:
        """Run a step and return every row's logits at every position (fp32, on the host).

        For tests and debugging: same state updates as ``execute``, no sampling.
        """
        pools = self._pools()
        with torch.no_grad():
            plan = StepPlan.build(batch, pools.block_size, self.device)
            logits = self.model.logits(self.model.hidden_states(plan, pools)).cpu()
        offsets = [0]
        for r in batch.rows:
            offsets.append(offsets[-1] + r.num_tokens)
        return [logits[a:b] for a, b in itertools.pairwise(offsets)]

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        with torch.no_grad():
            self._pools().copy_states(ops)
