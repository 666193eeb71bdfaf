"""What users import keeps its address, and the client stays light: importing it
pulls in none of the daemon's configuration code."""

from __future__ import annotations

import subprocess
import sys


def test_the_client_imports_no_daemon_configuration() -> None:
    code = (
        "import sys, edged.client; "
        "print(sorted(m for m in sys.modules if m == 'tomllib' or m.startswith(('edged.config', 'edged.serve'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert result.stdout.strip() == "[]"


def test_public_names_keep_their_import_paths() -> None:
    from edged.client import (  # noqa: F401
        AsyncClient,
        Client,
        DeadlineExceeded,
        EdgedError,
        Internal,
        InvalidArgument,
        NoReply,
        NotFound,
        Overloaded,
        Unavailable,
    )
    from edged.client.keys import ClientKeys  # noqa: F401
    from edged.protocol import decode_reply, encode_request  # noqa: F401
    from edged.wire.codec import encode_request as codec_encode_request

    assert encode_request is codec_encode_request
