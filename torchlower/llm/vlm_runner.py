"""Running a multimodal LM export (``vlm.py``) in tract: encode the media, splice, decode greedily.

Per prompt: the embedding graph maps the ids to rows, the encoder graph (vision or audio) runs
once per item, its feature rows replace the rows of the placeholder token in order (the
manifest's ``media``), and the decoder prefills on those embeddings; each later step embeds
the one new token and feeds it. The decoder's KV cache is tract state when tract's
``detect_kv_cache`` recognizes every cache, else explicit tensors (``runner.Decoder``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.errors import InvalidArgumentError
from torchlower.llm.decoder import Decoder
from torchlower.llm.manifest import part_path, tract_load
from torchlower.llm.manifest import read_manifest as read_format_manifest
from torchlower.llm.mrope import mrope_positions, text_positions
from torchlower.llm.vlm_parts import scatter_media

MANIFEST = "manifest.json"
FORMAT = "torchlower.multimodal_lm"


def is_multimodal(path: Path) -> bool:
    """A folder whose manifest is a multimodal LM's (not a speech encoder-decoder's)."""
    if not (path.is_dir() and (path / MANIFEST).is_file()):
        return False
    try:
        return json.loads((path / MANIFEST).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def read_manifest(folder: Path) -> dict[str, Any]:
    return read_format_manifest(folder, FORMAT)


def as_array(value: Any) -> np.ndarray:
    """A tensor or array-like as a numpy array."""
    return np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)


class MultimodalRunner:
    """The embedding, encoder and decoder archives of ``folder`` loaded in tract."""

    def __init__(self, folder: str | Path, kv: str = "auto") -> None:
        import tract

        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        self.media = self.manifest["media"]
        nnef = tract.nnef().with_tract_extra().with_tract_transformers()

        # every archive named before tract loads any: a missing one fails at once, naming it
        embed, encoder, decoder = (
            part_path(self.folder, self.manifest, p) for p in ("embed", self.media["part"], "decoder")
        )
        self.embed = tract_load(nnef, embed).into_runnable()
        self.encoder = tract_load(nnef, encoder).into_runnable()
        self.decoder = Decoder(decoder, kv=kv)
        self.vocab = int(self.manifest["vocab_size"])
        self.positions = self.manifest.get("positions")  # Qwen2-VL's M-RoPE: fed by the runner
        self.next_position = 0
        self.blocks = self.manifest.get("attention") is not None  # Gemma 3's image-block input

    @property
    def mode(self) -> str:
        return self.decoder.mode

    def features(self, media: Any, mask: Any = None) -> np.ndarray:
        """The encoder's feature rows [rows, hidden] of ``media`` (one item, or a batch of items
        along axis 0), each item of the manifest's input shape; ``mask`` [items, frames] marks
        each item's real frames (1) and padding (0), default all real, when the encoder takes one."""
        entry = self.manifest[self.media["part"]]
        want = list(entry["inputs"][self.media["input"]])  # batch 1
        array = as_array(media)
        # one item without the batch axis, or items concatenated along axis 0 (Qwen2-VL's patches)
        if array.ndim == len(want) - 1 and array.size % int(np.prod(want[1:])) == 0:
            array = array.reshape(-1, *want[1:])
        if array.ndim != len(want) or list(array.shape[1:]) != want[1:] or array.dtype.kind != "f":
            raise InvalidArgumentError(
                f"{self.media['input']} must be float [n, {', '.join(map(str, want[1:]))}] (n items,"
                f" preprocessed as the manifest's {self.media['part']}.preprocessing says); got"
                f" {array.dtype} {list(array.shape)}"
            )
        masks = self._masks(mask, array.shape[0], want[-1])
        rows = []
        for i, item in enumerate(array):
            feed = [
                np.ascontiguousarray(item[None], np.float32),
                *([masks[i : i + 1]] if masks is not None else []),
            ]
            out = self.encoder.run(feed)
            real = int(out[1].to_numpy().reshape(-1)[0]) if len(out) > 1 else None
            rows.append(out[0].to_numpy()[0, :real])
        return np.concatenate(rows, axis=0)

    def _masks(self, mask: Any, items: int, frames: int) -> np.ndarray | None:
        name = self.media.get("mask_input")
        if name is None:
            if mask is not None:
                raise InvalidArgumentError(
                    f"{self.folder}: this model's {self.media['part']} encoder takes no mask"
                )
            return None
        if mask is None:
            return np.ones((items, frames), np.int64)
        array = as_array(mask)
        if array.shape != (items, frames) or not set(np.unique(array)) <= {0, 1}:
            raise InvalidArgumentError(
                f"{name} must be 0/1 of shape [{items}, {frames}] (1 for each real frame);"
                f" got {list(array.shape)}"
            )
        return np.ascontiguousarray(array, np.int64)

    def embeddings(self, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1)
        if ids.min() < 0 or ids.max() >= self.vocab:
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            raise InvalidArgumentError(f"token id {bad} is outside the vocabulary (ids 0..{self.vocab - 1})")
        return self.embed.run([ids])[0].to_numpy()

    def prefill(self, ids: np.ndarray, media: Any, mask: Any = None) -> np.ndarray:
        """Logits of the prompt's last position: ``ids`` [1, S] with one placeholder row per
        feature row of ``media`` (None: a text-only prompt)."""
        self.decoder.reset()
        embeds = self.embeddings(ids)
        slots = int((ids == self.media["token_id"]).sum())
        if media is not None or slots:
            rows = self.features(media, mask) if media is not None else np.zeros((0, embeds.shape[2]))
            if slots != rows.shape[0]:
                raise InvalidArgumentError(
                    f"the prompt holds {slots} {self.media['token_id']} tokens (the {self.media['part']}"
                    f" placeholder) but the {self.media['input']} give {rows.shape[0]} feature rows"
                    f" (up to {self.media['tokens_per_item']} per item): put one placeholder per row in"
                    " the prompt, as the model's processor does"
                )
            embeds = scatter_media(embeds, ids, int(self.media["token_id"]), rows)
        if self.blocks:
            return self.decoder.run(embeds, image_blocks(ids, int(self.media["token_id"])))
        if self.positions is None:
            return self.decoder.run(embeds)
        grid = self.positions["merged_grid"]
        where, self.next_position = mrope_positions(ids, int(self.media["token_id"]), grid)
        return self.decoder.run(embeds, where)

    def step(self, token: int) -> np.ndarray:
        embeds = self.embeddings(np.array([[token]]))
        if self.blocks:  # a generated token is text: causal
            return self.decoder.run(embeds, np.zeros((1, 1), np.int64))
        if self.positions is None:
            return self.decoder.run(embeds)
        self.next_position += 1
        return self.decoder.run(embeds, text_positions(self.next_position - 1))

    def greedy(
        self, prompt: np.ndarray, steps: int, media: Any, mask: Any = None, stops: set[int] | None = None
    ) -> tuple[list[int], list[np.ndarray]]:
        """Arg-max tokens after ``prompt`` and the logits that chose each."""
        if steps:  # the last new token is not fed back
            self.decoder.refuse_past_context(prompt.shape[1] + steps - 1)
        tokens: list[int] = []
        logits: list[np.ndarray] = []
        for i in range(steps):
            row = self.prefill(prompt, media, mask) if i == 0 else self.step(tokens[-1])
            logits.append(row)
            tokens.append(int(np.argmax(row)))
            if stops and tokens[-1] in stops:
                break
        return tokens, logits


def image_blocks(ids: np.ndarray, token_id: int) -> np.ndarray:
    """[1, S] i64: each run of ``token_id`` in ``ids`` numbered 1, 2, …, 0 elsewhere (the
    manifest's ``attention``; HF's ``get_block_sequence_ids_for_mask`` plus one)."""
    image = np.asarray(ids).reshape(1, -1) == token_id
    starts = image & ~np.pad(image, ((0, 0), (1, 0)))[:, :-1]
    return np.where(image, np.cumsum(starts, axis=1), 0).astype(np.int64)
