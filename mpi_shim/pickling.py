"""``MPI.Pickle`` and ``MPI.pickle``: how the lowercase (object) calls
serialize Python objects."""
from __future__ import annotations

import pickle as _pickle


class Pickle:
    """Pickle/unpickle Python objects (``MPI.pickle``).

    ``Pickle(dumps, loads, protocol)``: a custom serializer is called as
    ``dumps(obj)`` when ``protocol`` is None, else ``dumps(obj, protocol)``;
    the default is the ``pickle`` module with its highest protocol.
    """

    def __init__(self, dumps=None, loads=None, protocol=None, threshold=None):
        self._custom = dumps is not None
        self._dumps = dumps or _pickle.dumps
        self._loads = loads or _pickle.loads
        if protocol is None and not self._custom:
            protocol = _pickle.HIGHEST_PROTOCOL
        self.PROTOCOL = protocol
        self.THRESHOLD = threshold

    @property
    def THRESHOLD(self) -> int:
        """Buffers this large or larger travel out of band (``dumps_oob``)."""
        return self._threshold

    @THRESHOLD.setter
    def THRESHOLD(self, value) -> None:
        self._threshold = 256 * 1024 if value is None else int(value)

    def _protocol(self):
        p = self.PROTOCOL
        return _pickle.DEFAULT_PROTOCOL if p is None else p

    def dumps(self, obj):
        """Serialize an object to bytes."""
        if self._custom and self.PROTOCOL is None:
            return self._dumps(obj)
        return self._dumps(obj, self._protocol())

    def loads(self, data):
        """Deserialize an object from bytes."""
        return self._loads(data)

    def dumps_oob(self, obj):
        """Serialize an object; returns ``(data, out-of-band buffers)``."""
        from .memory import buffer      # deferred: .memory imports numpy (start-up, issue 44)
        bufs = []

        def out_of_band(pb):
            raw = pb.raw()
            if raw.nbytes < self.THRESHOLD:
                return True                 # small: serialized in band
            bufs.append(buffer.frombuffer(raw))
            return False
        data = _pickle.dumps(obj, max(self._protocol(), 5), buffer_callback=out_of_band)
        return data, bufs

    def loads_oob(self, data, buffers):
        """Deserialize an object from bytes and out-of-band buffers."""
        return _pickle.loads(data, buffers=buffers)


pickle = Pickle()
