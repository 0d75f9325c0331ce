from typing import Any

__version__: str
__author__: str

class Rc:
    initialize: bool
    threads: bool
    thread_level: str
    finalize: bool | None
    fast_reduce: bool
    recv_mprobe: bool
    irecv_bufsz: int
    errors: str
    def __init__(self, **kwargs: Any) -> None: ...
    def __call__(self, **kwargs: Any) -> None: ...

rc: Rc

def get_include() -> str: ...
def get_config() -> dict[str, str]: ...
def profile(name: str, *, path: str | list[str] | None = ...) -> None: ...
