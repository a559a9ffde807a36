"""Rows of framed, captioned thumbnails drawn into one PIL image (worst queries, duplicate groups); PIL only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from PIL import Image, ImageDraw, ImageOps

RED, GREEN, BLUE, GREY = (220, 40, 40), (30, 170, 60), (40, 90, 220), (190, 190, 190)


@dataclass(frozen=True)
class Tile:
    """One thumbnail of a grid: the image, a caption under it and the colour of its frame."""

    image: Image.Image
    caption: str
    frame: tuple[int, int, int] = GREY


def grid_image(rows: Sequence[Sequence[Tile]], size: int = 96, frame: int = 4, caption_px: int = 14,
               row_titles: Sequence[str] | None = None) -> Image.Image:
    """One RGB image: each row of tiles left to right, each tile `size` px square inside its coloured frame,
    its caption below; an optional title line above each row."""
    title_px = caption_px if row_titles else 0
    cell_w, cell_h = size + 2 * frame + 4, size + 2 * frame + caption_px + 4
    width = max(1, max((len(r) for r in rows), default=1)) * cell_w
    canvas = Image.new("RGB", (width, max(1, len(rows)) * (cell_h + title_px)), "white")
    draw = ImageDraw.Draw(canvas)
    for r, row in enumerate(rows):
        top = r * (cell_h + title_px)
        if row_titles:
            draw.text((2, top), row_titles[r][:width // 6], fill=(0, 0, 0))
        for c, tile in enumerate(row):
            x, y = c * cell_w + 2, top + title_px + 2
            draw.rectangle([x, y, x + size + 2 * frame - 1, y + size + 2 * frame - 1], fill=tile.frame)
            thumb = ImageOps.pad(tile.image.convert("RGB"), (size, size), color=(255, 255, 255))
            canvas.paste(thumb, (x + frame, y + frame))
            draw.text((x, y + size + 2 * frame + 1), tile.caption[:cell_w // 6], fill=(0, 0, 0))
    return canvas
