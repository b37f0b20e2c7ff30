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
from numba import njit

__all__ = ["SLOT_PHASE", "PictureError", "decode_picture", "decode_pictures", "jpeg_decoder", "jpeg_frames"]

_JPEG, _PNG = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"
_simplejpeg: Any = None

SLOT_PHASE = 16
"""Where a batch's run of picture slots starts: this many bytes past a 64-byte boundary. libjpeg-turbo's AVX2
colour conversion writes each output row that starts 32-byte aligned with non-temporal stores (``vmovntdq``,
past the caches) and any other row with ordinary stores. Decoding a batch's 96 JPEGs (64 at 256x256, 32 at
128x128) into pooled shared-memory slots took 3-6% more CPU with the rows aligned than 16 bytes off (one
process, 7 interleaved rounds; ``python -m mmfeed.bench.rlds_compare`` measures its limit both ways). Rows are
``3 * width`` bytes, so where the width is a multiple of 32 (128, 224, 256, 320, 640) every row of every slot
keeps the run's phase. (Without AVX2, libjpeg-turbo's SSE2 code tests 16-byte alignment, which this phase
keeps: such CPUs store as before.)"""


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
    and colour go straight to libjpeg-turbo (their frame headers read by :func:`jpeg_frames` in one call),
    anything else through :func:`decode_picture`. A :class:`PictureError` names the first picture that fails and why."""
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
    decode_jpeg, (h0, w0) = _simplejpeg.decode_jpeg, declared
    colorspace = "BGR" if bgr else "RGB"
    direct = (max_pixels is None or h0 * w0 <= max_pixels) & _direct_jpegs(jpeg_frames(data, spans), h0, w0)
    for i, ((a, b), fast) in enumerate(zip(spans.tolist(), direct.tolist())):
        try:
            if fast:  # a YCbCr or grey JPEG of the declared size: libjpeg-turbo checks the rest as it decodes
                try:
                    decode_jpeg(view[a:b], colorspace=colorspace, fastdct=True, buffer=out[i])
                except ValueError as err:
                    raise ValueError(f"cannot be decoded ({err})") from None
            else:  # decode_picture says what is wrong, or decodes it another way
                decode_picture(view[a:b], size, declared, frame_format, bgr, max_pixels, out=out[i])
        except ValueError as err:
            raise PictureError(i, str(err)) from None


def _direct_jpegs(frames: np.ndarray, h0: int, w0: int) -> np.ndarray:
    """Which pictures of :func:`jpeg_frames` libjpeg-turbo decodes straight to RGB at the declared size."""
    return (frames[:, 0] == h0) & (frames[:, 1] == w0) & (frames[:, 2] > 0)


@njit(cache=True, nogil=True)
def jpeg_frames(data: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Each JPEG's frame header, read from its markers up to the first scan: int64 ``[n, 3]`` of height, width
    and what libjpeg decides the colour space is: 1 YCbCr, 2 grey, 0 anything else (RGB, CMYK, YCCK), -1 no
    JPEG frame header found (not a JPEG, cut short, a marker that does not parse). libjpeg's rule: one component
    is grey; three are YCbCr after a JFIF marker, else as an Adobe marker's transform says (0: RGB), else RGB
    when the components are named R, G, B. Every read stays inside its span."""
    out = np.full((spans.shape[0], 3), -1, np.int64)
    for k in range(spans.shape[0]):
        a, b = spans[k, 0], spans[k, 1]
        if a < 0 or b > data.shape[0] or b - a < 4 or data[a] != 0xFF or data[a + 1] != 0xD8:
            continue
        i, h, w, nf, rgb_ids, jfif, adobe = a + 2, -1, -1, -1, False, False, -1
        while i + 4 <= b:
            if data[i] != 0xFF:
                break
            while i < b and data[i] == 0xFF:  # fill bytes before a marker
                i += 1
            if i + 3 > b:
                break
            m = data[i]
            if m == 0xDA:  # the first scan: every marker that decides the frame came before it
                if nf == 1:
                    out[k, 0], out[k, 1], out[k, 2] = h, w, 2
                elif nf == 3:
                    ycc = jfif or (adobe != 0 if adobe >= 0 else not rgb_ids)
                    out[k, 0], out[k, 1], out[k, 2] = h, w, 1 if ycc else 0
                elif nf > 0:
                    out[k, 0], out[k, 1], out[k, 2] = h, w, 0
                break
            if m == 0xD9:  # the image ends before a scan
                break
            if m == 0x01 or 0xD0 <= m <= 0xD8:  # markers without a length
                i += 1
                continue
            n = (np.int64(data[i + 1]) << 8) | np.int64(data[i + 2])
            if n < 2 or i + 1 + n > b:
                break
            seg = i + 3  # the segment's body, n - 2 bytes
            if 0xC0 <= m <= 0xCF and m != 0xC4 and m != 0xC8 and m != 0xCC:  # a start of frame
                if n < 8 or nf >= 0:  # a second frame header: not one picture libjpeg reads as such
                    break
                h = (np.int64(data[seg + 1]) << 8) | np.int64(data[seg + 2])
                w = (np.int64(data[seg + 3]) << 8) | np.int64(data[seg + 4])
                nf = np.int64(data[seg + 5])
                if n < 8 + 3 * nf:
                    break
                rgb_ids = nf == 3 and data[seg + 6] == 82 and data[seg + 9] == 71 and data[seg + 12] == 66
            elif m == 0xE0 and n >= 16 and data[seg] == 74 and data[seg + 1] == 70 and data[seg + 2] == 73 \
                    and data[seg + 3] == 70 and data[seg + 4] == 0:  # APP0 "JFIF\0"
                jfif = True
            elif m == 0xEE and n >= 14 and data[seg] == 65 and data[seg + 1] == 100 and data[seg + 2] == 111 \
                    and data[seg + 3] == 98 and data[seg + 4] == 101:  # APP14 "Adobe": its transform byte
                adobe = np.int64(data[seg + 11])
            i += 1 + n
        if h <= 0 or w <= 0:
            out[k, 0], out[k, 1], out[k, 2] = -1, -1, -1
    return out


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
