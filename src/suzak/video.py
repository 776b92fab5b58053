"""Videos read once, to the video budget: a file (decoded with PyAV), a list of frame files, or decoded frames.

A row's ``video`` becomes a :class:`Clip`: the frames :class:`suzak.vision.VideoBudget` picks, each fitted to the
budget's frame size, with where they came from (the source's fps, which frames, of how many). Every consumer gets
the clip's frames as they are and its metadata (:meth:`Clip.metadata`): the processor, through
:func:`processor_kwargs`, never samples or resizes them again, so training, generation and evaluation see the same
frames and the same number of video tokens. Qwen2.5-VL places frames in time with the metadata's sampled fps
(``second_per_grid_ts``), Qwen3-VL writes its timestamps into the prompt from it.

PyAV (``av``, which qwen-vl-utils installs on every path) decodes files. An unreadable, missing or empty video is one
:class:`~suzak.SuzakError` line that names it.

>>> from suzak.vision import VideoBudget
>>> budget = VideoBudget(fps=2.0, max_frames=8, max_pixels=12544, factor=28)
>>> frames = [Image.new("RGB", (64, 48), (i, 0, 0)) for i in range(10)]
>>> clip = read_clip(frames, budget, fps=5.0)  # 2 s at 2 fps: 4 of the 10 frames
>>> clip.frames.shape, clip.indices, clip.metadata()["fps"]
((4, 56, 56, 3), (0, 3, 6, 9), 5.0)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from suzak import SuzakError
from suzak.vision import VideoBudget

__all__ = ["Clip", "clip_key", "decode_file", "processor_kwargs", "read_clip"]


@dataclass(frozen=True, eq=False)
class Clip:
    """The frames of one video as every consumer sees them, and where they came from.

    ``frames``: (T, H, W, 3) uint8, fitted to the budget; ``fps``: the source's frames per second; ``indices``: which
    of the source's ``total_frames`` frames they are; ``source``: how messages name the video.
    """

    frames: np.ndarray
    fps: float
    indices: tuple[int, ...]
    total_frames: int
    source: str = "a video"

    def metadata(self) -> dict[str, Any]:
        """transformers' ``VideoMetadata`` fields of the clip (its ``sampled_fps`` follows from them)."""
        _, height, width, _ = self.frames.shape
        return {"fps": self.fps, "frames_indices": list(self.indices), "total_num_frames": self.total_frames,
                "height": height, "width": width}  # fmt: skip

    @property
    def sampled_fps(self) -> float:
        """Frames per second of the clip itself: how far apart in time its frames are."""
        return len(self.indices) / self.total_frames * self.fps


def processor_kwargs(clips: Sequence[Clip]) -> dict[str, Any]:
    """Keyword arguments for a processor call (or ``apply_chat_template``'s ``processor_kwargs``) on these clips, in
    the order their videos appear: their metadata, and no frame sampling or resizing of the processor's own."""
    videos = {"do_sample_frames": False, "do_resize": False, "cap_pixels_per_frame": True}
    return {"video_metadata": [clip.metadata() for clip in clips], "videos_kwargs": videos}


def clip_key(source: Any, fps: float | None = None) -> Any:
    """A key under which equal video sources (a path, or frames of equal pixels) read to the same clip: a batch holds
    each prompt ``num_generations`` times, each a separately decoded copy of its frames.

    >>> clip_key("a.mp4") == clip_key("a.mp4"), clip_key([Image.new("RGB", (2, 2))]) == clip_key([Image.new("RGB", (2, 2))])
    (True, True)
    """
    if isinstance(source, (str, os.PathLike)):
        return ("path", os.fspath(source), fps)
    if isinstance(source, np.ndarray):
        return ("array", source.shape, hashlib.sha1(np.ascontiguousarray(source).tobytes()).hexdigest(), fps)
    if isinstance(source, Sequence):
        digest = hashlib.sha1()
        for frame in source:
            if isinstance(frame, Image.Image):
                digest.update(f"{frame.mode}{frame.size}".encode())
                digest.update(frame.tobytes())
            else:
                digest.update(repr(frame).encode())
        return ("frames", len(source), digest.hexdigest(), fps)
    return ("object", id(source), fps)


def _name(source: Any) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else f"a video of {type(source).__name__}"


def decode_file(path: str | os.PathLike) -> tuple[list[Image.Image], float]:
    """Every frame of a video file as RGB images, and its frames per second (PyAV)."""
    import av

    path = Path(path)
    if not path.is_file():
        raise SuzakError(f"video {path} does not exist")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise SuzakError(f"video {path} has no video stream")
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.base_rate or 0) or None
            frames = [frame.to_image() for frame in container.decode(stream)]
    except SuzakError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as error:
        raise SuzakError(f"video {path} cannot be decoded: {error}") from None
    if not frames:
        raise SuzakError(f"video {path} has no frames")
    if fps is None:
        raise SuzakError(f"video {path} does not say its frame rate")
    return frames, fps


def _frame_file(path: str | os.PathLike) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except FileNotFoundError:
        raise SuzakError(f"video frame {path} does not exist") from None
    except (UnidentifiedImageError, OSError) as error:
        raise SuzakError(f"video frame {path} cannot be read: {error}") from None


def _frames(source: Any) -> list[Image.Image]:
    if isinstance(source, np.ndarray):
        if source.ndim != 4 or source.shape[-1] != 3:
            raise SuzakError(f"decoded video frames must be an array of shape (frames, height, width, 3), got "
                             f"{source.shape}")  # fmt: skip
        return [Image.fromarray(frame.astype(np.uint8), "RGB") for frame in source]
    if isinstance(source, Sequence) and not isinstance(source, str):
        frames = []
        for frame in source:
            if isinstance(frame, Image.Image):
                frames.append(frame)
            elif isinstance(frame, (str, os.PathLike)):
                frames.append(_frame_file(frame))
            elif isinstance(frame, Mapping) and frame.get("path"):  # a datasets Image() cell read undecoded
                frames.append(_frame_file(frame["path"]))
            else:
                raise SuzakError(f"a video frame must be an image or a path to one, got {type(frame).__name__}")
        return frames
    raise SuzakError(f"a video must be a file path, a list of frames (images or their paths) or an array of frames, "
                     f"got {type(source).__name__}")  # fmt: skip


def read_clip(source: Any, budget: VideoBudget, *, fps: float | None = None) -> Clip:
    """The clip the model sees of ``source``: a video file, a list of frames (images or paths) or a (T, H, W, 3)
    array. ``fps`` is the frame rate of a list or array (default: the budget's, so every frame up to
    ``max_frames`` is read); a file says its own."""
    if isinstance(source, (str, os.PathLike)):
        frames, rate = decode_file(source)
    else:
        frames, rate = _frames(source), float(fps or budget.fps)
        if not frames:
            raise SuzakError("a video has no frames")
    try:
        indices = budget.frame_indices(len(frames), rate)
    except ValueError as error:
        raise SuzakError(f"{_name(source)}: {error}") from None
    picked = [budget.fit(frames[i], len(indices)) for i in indices]
    if len({frame.size for frame in picked}) > 1:
        raise SuzakError(f"{_name(source)}: its frames differ in size ({sorted({f.size for f in picked})})")
    array = np.stack([np.asarray(frame, dtype=np.uint8) for frame in picked])
    return Clip(array, rate, tuple(indices), len(frames), _name(source))
