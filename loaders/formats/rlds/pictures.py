"""RLDS pictures (one JPEG or PNG per step, told by its magic bytes) decoded to uint8 frames.

JPEGs go to libjpeg-turbo through ``simplejpeg`` where it is installed (``pip install mmfeed[rlds]``): decoded
straight into the batch's slot, shrunk inside the decoder by DCT scaling where ``frame_size`` allows, with the
fast integer DCT TensorFlow's ``decode_jpeg`` uses (the pictures of a TFDS pipeline, within a level or two).
Otherwise, and for PNGs, Pillow decodes (``draft`` for the same DCT scaling); without Pillow, and for
``frame_format="yuv420"``, PyAV.

    >>> import io; from PIL import Image
    >>> buffer = io.BytesIO(); Image.new("RGB", (64, 48), (200, 30, 90)).save(buffer, "PNG")
    >>> decode_picture(buffer.getvalue(), None, (48, 64), "rgb24", False, None)[0, 0].tolist()
    [200, 30, 90]
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

__all__ = ["PictureError", "decode_picture", "decode_pictures", "jpeg_decoder"]

_JPEG, _PNG = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"
_simplejpeg: Any = None


def jpeg_decoder() -> str:
    """Which library decodes RLDS JPEGs to RGB in this process: "simplejpeg", "pillow" or "pyav"."""
    global _simplejpeg
    if _simplejpeg is None:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = False
        _simplejpeg = simplejpeg
    if _simplejpeg:
        return "simplejpeg"
    try:
        import PIL  # noqa: F401
    except ImportError:
        return "pyav"
    return "pillow"


def decode_picture(data: bytes | memoryview, size: tuple[int, int] | None, declared: tuple[int, int],
                   frame_format: str, bgr: bool, max_pixels: int | None, out: np.ndarray | None = None,
                   decoder: str | None = None) -> np.ndarray:
    """One JPEG or PNG as uint8 ``[H, W, 3]`` (``yuv420``: ``[H * 3 // 2, W]``), at ``size`` or as stored, written
    into ``out`` where given (and returned); the stored size must be ``declared``, at most ``max_pixels``. A
    ValueError says what is wrong. ``decoder`` picks the library (default: :func:`jpeg_decoder`'s for JPEGs)."""
    head = bytes(data[:8])
    jpeg = head.startswith(_JPEG)
    if not (jpeg or head.startswith(_PNG)):
        raise ValueError(f"neither JPEG nor PNG (starts {head.hex()})")
    default = jpeg_decoder()  # loads simplejpeg, once
    decoder = decoder or default
    if frame_format != "rgb24" or decoder == "pyav":
        array = _decode_av(data, size, declared, frame_format, bgr, max_pixels)
    elif jpeg and decoder == "simplejpeg":
        array = _decode_simplejpeg(data, size, declared, bgr, max_pixels, out)
        if array is None:  # a colour space libjpeg-turbo does not turn into RGB (CMYK): Pillow's conversion
            array = _decode_pillow(data, size, declared, bgr, max_pixels)
    else:
        array = _decode_pillow(data, size, declared, bgr, max_pixels)
    if out is None:
        return array
    if array is not out:
        out[...] = array
    return out


class PictureError(ValueError):
    """:func:`decode_pictures` could not decode picture ``index`` of its run: ``reason`` says why."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"picture {index}: {reason}")
        self.index, self.reason = index, reason


def decode_pictures(data: np.ndarray, spans: np.ndarray, out: np.ndarray, declared: tuple[int, int],
                    size: tuple[int, int] | None, frame_format: str, bgr: bool, max_pixels: int | None) -> None:
    """A run of pictures, each ``data[start:stop]`` of ``spans`` (int64 ``[n, 2]``), decoded into ``out[i]``
    (``[n, *frame]``) as :func:`decode_picture` decodes them, one loop for the run: JPEGs of the declared size
    and colour go straight to libjpeg-turbo (their header checked first), anything else through
    :func:`decode_picture`. A :class:`PictureError` names the first picture that fails and why."""
    view = memoryview(data)
    fast = (frame_format == "rgb24" and (size is None or tuple(size) == tuple(declared))
            and jpeg_decoder() == "simplejpeg" and out.shape[1:] == (*declared, 3) and out.flags.c_contiguous)
    if not fast:
        for i, (a, b) in enumerate(spans.tolist()):
            try:
                decode_picture(view[a:b], size, declared, frame_format, bgr, max_pixels, out=out[i])
            except ValueError as err:
                raise PictureError(i, str(err)) from None
        return
    header, decode_jpeg = _simplejpeg.decode_jpeg_header, _simplejpeg.decode_jpeg
    h0, w0 = declared
    colorspace = "BGR" if bgr else "RGB"
    for i, (a, b) in enumerate(spans.tolist()):
        blob = view[a:b]
        try:
            h, w, colours, _ = header(blob) if blob[:3] == _JPEG else (0, 0, None, None)
        except ValueError as err:
            raise PictureError(i, f"cannot be decoded ({err})") from None
        if h == h0 and w == w0 and colours in _RGB_DIRECT and (max_pixels is None or h * w <= max_pixels):
            try:
                decode_jpeg(blob, colorspace=colorspace, fastdct=True, buffer=out[i])
            except ValueError as err:
                raise PictureError(i, f"cannot be decoded ({err})") from None
        else:  # not a JPEG of the declared size and colours: decode_picture says what is wrong, or decodes it
            try:
                decode_picture(blob, size, declared, frame_format, bgr, max_pixels, out=out[i])
            except ValueError as err:
                raise PictureError(i, str(err)) from None


_RGB_DIRECT = ("YCbCr", "Gray")  # colour spaces libjpeg-turbo turns into RGB itself


def _check_size(h: int, w: int, declared: tuple[int, int], max_pixels: int | None) -> None:
    if max_pixels is not None and h * w > max_pixels:
        raise ValueError(f"a picture of {h}x{w}, more than max_frame_pixels={max_pixels}")
    if (h, w) != tuple(declared):
        raise ValueError(f"a picture of {h}x{w}, features.json declares {declared[0]}x{declared[1]}")


def _decode_simplejpeg(data: bytes | memoryview, size: tuple[int, int] | None, declared: tuple[int, int], bgr: bool,
                       max_pixels: int | None, out: np.ndarray | None) -> np.ndarray | None:
    decode_jpeg, header = _simplejpeg.decode_jpeg, _simplejpeg.decode_jpeg_header
    try:
        h, w, colours, _ = header(data)
    except ValueError as err:
        raise ValueError(f"cannot be decoded ({err})") from None
    _check_size(h, w, declared, max_pixels)
    if colours not in _RGB_DIRECT:
        return None
    small = size is not None and (size[0] < h or size[1] < w)
    try:
        scaled = header(data, min_height=size[0], min_width=size[1])[:2] if small else (h, w)
        whole = size is None or tuple(scaled) == tuple(size)
        into = out if whole and out is not None and out.flags.c_contiguous and out.shape == (*scaled, 3) else None
        array = decode_jpeg(data, colorspace="BGR" if bgr else "RGB", fastdct=True,
                            min_height=size[0] if small else 0, min_width=size[1] if small else 0, buffer=into)
    except ValueError as err:
        raise ValueError(f"cannot be decoded ({err})") from None
    if into is not None:
        return out
    if not whole:  # DCT scaling went as far as it could above the size: the rest as Pillow resizes
        from PIL import Image

        array = np.asarray(Image.fromarray(array).resize((size[1], size[0]), Image.BILINEAR))
    return array


def _decode_pillow(data: bytes | memoryview, size: tuple[int, int] | None, declared: tuple[int, int], bgr: bool,
                   max_pixels: int | None) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=("JPEG", "PNG")) as image:
            w, h = image.size
            _check_size(h, w, declared, max_pixels)
            if size is not None and image.format == "JPEG" and (size[0] < h or size[1] < w):
                image.draft("RGB", (size[1], size[0]))  # DCT scaling: at least the size asked
            image.load()
            picture = image if image.mode == "RGB" else image.convert("RGB")  # no copy of an RGB picture
            if size is not None and (picture.size[1], picture.size[0]) != tuple(size):
                picture = picture.resize((size[1], size[0]), Image.BILINEAR)
            array = np.asarray(picture)
    except (OSError, Image.DecompressionBombError, SyntaxError) as err:
        raise ValueError(f"cannot be decoded ({err})") from None
    return array[..., ::-1] if bgr else array


def _decode_av(data: bytes | memoryview, size: tuple[int, int] | None, declared: tuple[int, int], frame_format: str,
               bgr: bool, max_pixels: int | None) -> np.ndarray:
    import av

    from mmfeed.codecs.demux import IMAGE_FORMATS, frames_of, input_options, pixel_limit

    try:
        with av.open(io.BytesIO(data), options=pixel_limit(max_pixels),
                     container_options=input_options(IMAGE_FORMATS, path=False)) as container:
            stream = container.streams.video[0]
            _check_size(stream.codec_context.height, stream.codec_context.width, declared, max_pixels)
            frame = next(frames_of(container, stream))
            h, w = size or declared
            if frame_format != "rgb24":  # limited range, as video's I420 planes (an image decoder says full range)
                return frame.reformat(width=w, height=h, format="yuv420p", dst_color_range="MPEG").to_ndarray()
            return frame.reformat(width=w, height=h, format="bgr24" if bgr else "rgb24").to_ndarray()
    except (av.error.FFmpegError, StopIteration) as err:
        raise ValueError(f"cannot be decoded ({err})") from None
