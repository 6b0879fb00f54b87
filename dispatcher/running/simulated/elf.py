"""A simulated binary as a small ELF file: a symbol per OCaml function of its program, so that a
simulated profile's sampled offsets name functions through the same symbol table reading as a
real binary's (``dispatcher.search.focus.SymbolTable``), and a ``.simulated`` section holding
what the binary is (its program, decisions, modelled run time and profile).

The file holds no code: one loadable segment of zeros, 16 bytes per function, the first 16
bytes left to no symbol (samples there are the runtime's, as samples in a real binary's C
code are).  Symbols are mangled as ocamlopt mangles them (``camlModule__name_N``, the name's
punctuation ``$``-escaped) so that ``focus.demangle`` gives each function's name back.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

SECTION = ".simulated"
BASE = 0x400000  # the segment's virtual address, less its file offset
SLOT = 16  # bytes per function in the segment
_EHDR, _PHDR, _SHDR, _SYM = 64, 56, 64, 24
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3
_PT_LOAD, _PF_R_X = 1, 5
_SHF_ALLOC_EXEC = 0x6
_STT_FUNC_GLOBAL = (1 << 4) | 2


class ElfError(ValueError):
    """Not a simulated binary's ELF file."""


def mangle(function: str, stamp: int) -> str:
    """``Module.name`` -> ``camlModule__name_<stamp>``: every character of the name but letters
    and digits ``$``-escaped, so the name holds no ``__`` and ``focus.demangle`` splits it off
    the module where this split it."""
    module, _, name = function.partition(".")
    escaped = "".join(c if c.isascii() and c.isalnum() else f"${ord(c):02x}" for c in name)
    return f"caml{module}__{escaped}_{stamp}"


def nameable(function: str) -> bool:
    """Whether ``mangle`` gives a symbol ``demangle`` reads back: ``Module.name``, the module
    a capitalised ASCII name, every character of the name one byte (``$XX``: two hex
    digits)."""
    module, dot, name = function.partition(".")
    return bool(dot and module[:1].isupper() and module.isascii() and name
                and all(ord(c) < 256 for c in name))


@dataclass(frozen=True)
class Layout:
    """Where each function lies in the file: ``offsets[f]`` is a file offset inside ``f``;
    ``runtime`` one inside no function."""

    functions: tuple[str, ...]
    text_offset: int

    @property
    def runtime(self) -> int:
        return self.text_offset + 4

    def offset(self, index: int) -> int:
        return self.text_offset + SLOT * (index + 1) + 4


def layout(functions: Sequence[str]) -> Layout:
    return Layout(tuple(functions), _EHDR + _PHDR)


def elf_bytes(lay: Layout, note: bytes) -> bytes:
    """The ELF file of ``lay``'s functions with ``note`` as its ``.simulated`` section."""
    text_size = SLOT * (len(lay.functions) + 1)
    strtab = bytearray(b"\0")
    symbols = [bytes(_SYM)]
    for i, f in enumerate(lay.functions):
        name_at = len(strtab)
        strtab += mangle(f, i).encode("latin-1") + b"\0"
        address = BASE + lay.text_offset + SLOT * (i + 1)
        symbols.append(struct.pack("<IBBHQQ", name_at, _STT_FUNC_GLOBAL, 0, 1, address, SLOT))
    symtab = b"".join(symbols)
    names = [b"", b".text", SECTION.encode(), b".symtab", b".strtab", b".shstrtab"]
    shstrtab = bytearray()
    name_offsets = []
    for n in names:
        name_offsets.append(len(shstrtab))
        shstrtab += n + b"\0"
    body = bytearray(lay.text_offset)
    body += bytes(text_size)
    sections = []  # (offset, size) of the sections after .text
    for data in (note, symtab, bytes(strtab), bytes(shstrtab)):
        while len(body) % 8:
            body.append(0)
        sections.append((len(body), len(data)))
        body += data
    while len(body) % 8:
        body.append(0)
    shoff = len(body)
    headers = [bytes(_SHDR),
               struct.pack("<IIQQQQIIQQ", name_offsets[1], _SHT_PROGBITS, _SHF_ALLOC_EXEC,
                           BASE + lay.text_offset, lay.text_offset, text_size, 0, 0, 16, 0),
               struct.pack("<IIQQQQIIQQ", name_offsets[2], _SHT_PROGBITS, 0, 0,
                           *sections[0], 0, 0, 1, 0),
               struct.pack("<IIQQQQIIQQ", name_offsets[3], _SHT_SYMTAB, 0, 0, *sections[1],
                           4, 1, 8, _SYM),
               struct.pack("<IIQQQQIIQQ", name_offsets[4], _SHT_STRTAB, 0, 0, *sections[2],
                           0, 0, 1, 0),
               struct.pack("<IIQQQQIIQQ", name_offsets[5], _SHT_STRTAB, 0, 0, *sections[3],
                           0, 0, 1, 0)]
    body += b"".join(headers)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    body[:_EHDR] = ident + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, BASE + lay.text_offset,
                                       _EHDR, shoff, 0, _EHDR, _PHDR, 1, _SHDR,
                                       len(headers), 5)
    body[_EHDR:_EHDR + _PHDR] = struct.pack("<IIQQQQQQ", _PT_LOAD, _PF_R_X, lay.text_offset,
                                            BASE + lay.text_offset, BASE + lay.text_offset,
                                            text_size, text_size, 16)
    return bytes(body)


def read_note(data: bytes) -> bytes:
    """The ``.simulated`` section of a file ``elf_bytes`` wrote (ElfError: not one)."""
    try:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ElfError("not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", data, 40)
        shnum, shstrndx = struct.unpack_from("<HH", data, 60)

        def header(i: int) -> tuple[int, int, int]:
            name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + _SHDR * i)
            return name, offset, size
        _, str_at, str_size = header(shstrndx)
        for i in range(shnum):
            name, offset, size = header(i)
            end = data.index(b"\0", str_at + name, str_at + str_size)
            if data[str_at + name:end] == SECTION.encode():
                return data[offset:offset + size]
    except (struct.error, IndexError, ValueError) as exc:
        raise ElfError(f"a damaged ELF file ({exc})") from None
    raise ElfError(f"no {SECTION} section")
