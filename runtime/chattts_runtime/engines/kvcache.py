"""A batched KV cache whose rows can join and leave between steps.

Rows are left-padded to a common length: ``valid[b, j]`` says whether column ``j`` of
row ``b`` holds a real position. Storage grows by doubling so a decode step writes in
place instead of concatenating; joining or leaving copies the rows once.
"""
from __future__ import annotations

import torch


class BatchKVCache:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, rows: int = 0):
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.valid = torch.zeros(rows, 0, dtype=torch.bool, device=device)
        self.length = 0  # used columns

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    def _alloc(self, rows: int, capacity: int) -> list[torch.Tensor]:
        return [torch.zeros(rows, self.kv_heads, capacity, self.head_dim, dtype=self.dtype, device=self.device)
                for _ in range(self.num_layers)]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def _reserve(self, extra: int) -> None:
        need = self.length + extra
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity, 64)
        keys, values = self._alloc(self.batch_size, cap), self._alloc(self.batch_size, cap)
        for layer in range(self.num_layers if self.keys else 0):
            keys[layer][:, :, :self.length] = self.keys[layer][:, :, :self.length]
            values[layer][:, :, :self.length] = self.values[layer][:, :, :self.length]
        self.keys, self.values = keys, values

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, H, T, D]`` new positions after the used columns; returns all columns."""
        t = k.shape[2]
        if layer == 0:
            self._reserve(t)
        self.keys[layer][:, :, self.length:self.length + t] = k
        self.values[layer][:, :, self.length:self.length + t] = v
        end = self.length + t
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, t: int, valid: torch.Tensor | None = None) -> None:
        """Mark ``t`` columns appended by every layer as used; ``valid [B, t]`` (default all True)."""
        if valid is None:
            valid = torch.ones(self.batch_size, t, dtype=torch.bool, device=self.device)
        self.valid = torch.cat((self.valid, valid.to(device=self.device, dtype=torch.bool)), dim=1)
        self.length += t

    def add_rows(self, other: "BatchKVCache") -> None:
        """Append the rows of ``other`` (e.g. a freshly prefilled request), left-padding either side."""
        if self.batch_size == 0:
            self.keys, self.values = other.keys, other.values
            self.valid, self.length = other.valid, other.length
            return
        new_len = max(self.length, other.length)
        rows = self.batch_size + other.batch_size
        cap = max(new_len + 64, self.capacity)
        keys, values = self._alloc(rows, cap), self._alloc(rows, cap)
        valid = torch.zeros(rows, new_len, dtype=torch.bool, device=self.device)
        for src, row0 in ((self, 0), (other, self.batch_size)):
            pad = new_len - src.length
            n = src.batch_size
            for layer in range(self.num_layers):
                keys[layer][row0:row0 + n, :, pad:new_len] = src.keys[layer][:, :, :src.length]
                values[layer][row0:row0 + n, :, pad:new_len] = src.values[layer][:, :, :src.length]
            valid[row0:row0 + n, pad:] = src.valid
        self.keys, self.values, self.valid, self.length = keys, values, valid, new_len

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every row not listed, then drop leading columns no remaining row uses."""
        if len(rows) == self.batch_size:
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.valid = self.valid.index_select(0, index)
        first_used = 0
        if rows:
            used = self.valid.any(dim=0).nonzero()
            first_used = int(used[0]) if used.numel() else self.length
        keep = self.length - first_used
        cap = max(keep + 64, 64)
        keys, values = self._alloc(len(rows), cap), self._alloc(len(rows), cap)
        for layer in range(self.num_layers):
            keys[layer][:, :, :keep] = self.keys[layer].index_select(0, index)[:, :, first_used:self.length]
            values[layer][:, :, :keep] = self.values[layer].index_select(0, index)[:, :, first_used:self.length]
        self.keys, self.values = keys, values
        self.valid = self.valid[:, first_used:]
        self.length = keep
