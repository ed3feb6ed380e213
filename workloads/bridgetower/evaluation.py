"""Quality: image <-> text retrieval over held-out pairs, the way contrastive models are judged.

Every held-out pair goes through the model once (no gradients, on the device, the run's precision); its text and
image embeddings (the contrastive heads' outputs, normalized) form an N x N similarity matrix, computed a block of
rows at a time (:data:`SIMILARITY_BLOCK_ELEMENTS`). Recall@k from text
to image is the share of texts whose own image ranks among the k most similar images; image to text likewise.
A tie counts against the model (the rank of the right answer is the number of others scoring at least as high), so
a collapsed model that gives every pair the same score has recall@1 of 0, not 1. ``eval_accuracy`` (MLPerf's key)
is the mean of the two recall@1 values.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable

import torch

from suite.figures import Figure, Witness

RECALL_KS = (1, 5)
#: The figures an evaluation records (:func:`retrieval_recall`), declared for the suite's catalogue.
QUALITY_FIGURES = (
    Figure("eval_accuracy", "1", "the mean of text-to-image and image-to-text recall@1 over the held-out pairs "
           "(ties count against the model): what --target-quality is compared with", "quality", 0.0, 1.0,
           witnesses=(Witness("last_evaluation"), Witness("log", "eval_accuracy"))),
    *(Figure(f"eval_recall_at_{k}_{direction}", "1", f"share of the held-out {asked} whose own {answer} ranks among "
             f"the {k} {answer}s most similar to it", "quality", 0.0, 1.0, witnesses=(Witness("last_evaluation"),))
      for direction, asked, answer in (("text_to_image", "captions", "image"), ("image_to_text", "images", "caption"))
      for k in RECALL_KS),
)


def retrieval_recall(text_embeds: torch.Tensor, image_embeds: torch.Tensor, ks: Iterable[int] = RECALL_KS
                     ) -> dict[str, float]:
    """Recall@k both ways for pairs ``(text_embeds[i], image_embeds[i])``; ``eval_accuracy`` = mean recall@1."""
    if text_embeds.shape != image_embeds.shape or text_embeds.ndim != 2 or len(text_embeds) < 2:
        raise ValueError(f"need two (N >= 2, D) embedding matrices, got {tuple(text_embeds.shape)} and "
                         f"{tuple(image_embeds.shape)}")
    texts, images = text_embeds.float(), image_embeds.float()
    figures: dict[str, float] = {}
    for direction, queries, answers in (("text_to_image", texts, images), ("image_to_text", images, texts)):
        ranks = _ranks_of_own_answer(queries, answers)
        for k in ks:
            figures[f"eval_recall_at_{k}_{direction}"] = float((ranks < k).float().mean())
    figures["eval_accuracy"] = (figures["eval_recall_at_1_text_to_image"]
                                + figures["eval_recall_at_1_image_to_text"]) / 2
    return figures


#: Similarity scores held at once while ranking (a block of query rows against every answer): 64 MB of float32,
#: whatever the number of held-out pairs (20,000 of them made a 1.6 GB matrix and a 5.7 GB process at once).
SIMILARITY_BLOCK_ELEMENTS = 2**24


def _ranks_of_own_answer(queries: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """For each query ``i``, how many answers score at least as high as its own answer ``i`` (a tie counts against
    it), computed a block of query rows at a time; each row's own score comes from the same product as the others,
    so a row ranks exactly as in the whole matrix."""
    count = len(queries)
    rows = max(1, SIMILARITY_BLOCK_ELEMENTS // count)
    ranks = torch.empty(count, dtype=torch.long)
    for start in range(0, count, rows):
        scores = queries[start:start + rows] @ answers.T
        own = scores[torch.arange(len(scores)), torch.arange(start, start + len(scores))].unsqueeze(1)
        ranks[start:start + len(scores)] = (scores >= own).sum(dim=1) - 1
    return ranks


@torch.no_grad()
def embed_pairs(model: Any, batches: Iterable[dict[str, Any]], pixel_values: Callable[[dict[str, Any]], torch.Tensor],
                to_device: Callable[[torch.Tensor], torch.Tensor], autocast: Callable[[], Any]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Text and image embeddings of every pair, in order (the model is switched to eval mode and back)."""
    was_training = model.training
    model.eval()
    texts, images = [], []
    try:
        for batch in batches:
            with autocast():
                out = model(input_ids=to_device(batch["input_ids"]), attention_mask=to_device(batch["attention_mask"]),
                            pixel_values=pixel_values(batch))
            texts.append(out.text_embeds.float().cpu())
            images.append(out.image_embeds.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(texts), torch.cat(images)


def held_out_indices(keys: list[str], fraction: float = 0.1, minimum: int = 8) -> list[int]:
    """A deterministic held-out split: the samples whose keys (the images' content hashes, see
    ``ImageCaptionSource.content_key``) hash lowest (sha256), key by key, until the ``fraction`` of samples (at least
    ``minimum``) is held out. Samples with the same key are always on the same side, and the split depends only on
    the dataset's content, never on the seed, the order or the machine."""
    count = min(len(keys), max(minimum, round(fraction * len(keys))))
    groups: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    held: list[int] = []
    for key in sorted(groups, key=lambda k: hashlib.sha256(k.encode()).hexdigest()):
        if len(held) >= count:
            break
        held += groups[key]
    return sorted(held)
