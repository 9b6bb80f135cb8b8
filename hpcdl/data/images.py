"""images.py - image files to arrays with Pillow: the decode step shared by the
writer (checking every image, or storing it decoded) and the reader (encoded
shards decode at read time). Arrays are uint8 (C, H, W), C = 1 (grey) or 3 (RGB).
"""
import io

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def decode(data, channels):
    """Encoded image bytes -> uint8 array (channels, H, W). ValueError saying
    what is wrong if the bytes are not a whole JPEG/PNG image."""
    from PIL import Image  # on use: loads PIL
    try:
        with Image.open(io.BytesIO(bytes(data))) as img:
            img = img.convert("L" if channels == 1 else "RGB")
            arr = np.asarray(img, dtype=np.uint8)
    except Exception as e:  # Pillow raises several types for broken data
        raise ValueError("image does not decode (%s: %s)" % (type(e).__name__, e))
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1).copy()


def probe(path):
    """(bytes, channels, (H, W)) of an image file, decoded once in full so
    that a truncated or corrupt file fails here. ValueError if it does not."""
    from PIL import Image  # on use: loads PIL
    with open(path, "rb") as f:
        data = f.read()
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            channels = 1 if img.mode in ("1", "L", "I;16", "I", "F") else 3
            size = (img.height, img.width)
    except Exception as e:
        raise ValueError("image does not decode (%s: %s)" % (type(e).__name__, e))
    return data, channels, size
