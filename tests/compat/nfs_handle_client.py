# SPDX-License-Identifier: MIT
"""An NFS client that keeps its file handles: test_nfs_handles runs it
inside ganesha's network namespace (nsenter).

    nfs_handle_client.py SERVER EXPORT VERSION PATH...

It mounts EXPORT with libnfs (the shared library, through ctypes: Debian
12 ships no libnfs Python binding and the -dev package is not needed),
opens every PATH once (LOOKUPs, and an OPEN for NFSv4), prints one JSON
line {"ready": [...]} and then, for each line "read" on stdin, reads every
file again through the handle it opened, never looking the name up again,
and prints one JSON line {PATH: [sha256, length] or "error text"}. EOF
closes the files and exits.
"""
import ctypes
import hashlib
import json
import sys

CHUNK = 1 << 20


def lib():
    nfs = ctypes.CDLL("libnfs.so.13")
    vp, u64 = ctypes.c_void_p, ctypes.c_uint64
    nfs.nfs_init_context.restype = vp
    nfs.nfs_get_error.restype = ctypes.c_char_p
    nfs.nfs_get_error.argtypes = [vp]
    nfs.nfs_set_version.argtypes = [vp, ctypes.c_int]
    nfs.nfs_set_timeout.argtypes = [vp, ctypes.c_int]
    nfs.nfs_mount.argtypes = [vp, ctypes.c_char_p, ctypes.c_char_p]
    nfs.nfs_open.argtypes = [vp, ctypes.c_char_p, ctypes.c_int,
                             ctypes.POINTER(vp)]
    # libnfs 4.0 (Debian 12): offset and count before the buffer.
    nfs.nfs_pread.argtypes = [vp, vp, u64, u64, ctypes.c_char_p]
    nfs.nfs_close.argtypes = [vp, vp]
    nfs.nfs_destroy_context.argtypes = [vp]
    return nfs


def read_all(nfs, ctx, fh):
    """The whole file by handle @fh, or an error string."""
    h, n, buf = hashlib.sha256(), 0, ctypes.create_string_buffer(CHUNK)
    while True:
        got = nfs.nfs_pread(ctx, fh, n, CHUNK, buf)
        if got < 0:
            return "pread at %d: %d %s" % (n, got, nfs.nfs_get_error(ctx).decode())
        if got == 0:
            return [h.hexdigest(), n]
        h.update(buf.raw[:got])
        n += got


def main(server, export, version, paths):
    nfs = lib()
    ctx = nfs.nfs_init_context()
    if not ctx:
        sys.exit("nfs_init_context failed")
    nfs.nfs_set_version(ctx, int(version))
    nfs.nfs_set_timeout(ctx, 120000)  # fail, do not hang, if a read is lost
    if nfs.nfs_mount(ctx, server.encode(), export.encode()):
        sys.exit("nfs_mount: " + nfs.nfs_get_error(ctx).decode())
    fhs = {}
    for p in paths:
        fh = ctypes.c_void_p()
        if nfs.nfs_open(ctx, ("/" + p).encode(), 0, ctypes.byref(fh)):
            sys.exit("nfs_open %s: %s" % (p, nfs.nfs_get_error(ctx).decode()))
        fhs[p] = fh
    print(json.dumps({"ready": paths}), flush=True)
    for line in sys.stdin:
        if line.strip() != "read":
            sys.exit("unknown command %r" % line)
        print(json.dumps({p: read_all(nfs, ctx, fh) for p, fh in fhs.items()}),
              flush=True)
    for fh in fhs.values():
        nfs.nfs_close(ctx, fh)
    nfs.nfs_destroy_context(ctx)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
