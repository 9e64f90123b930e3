"""The build key of a compiled CPU kernel covers the files its source includes."""

from __future__ import annotations

from pathlib import Path

from deepinfer_kernels.cpu.native import source_digest


def test_editing_an_included_file_changes_the_digest(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    main = tmp_path / "main.c"
    main.write_text('#include <math.h>\n  #  include "sub/helper.c"\nint f(void) { return g(); }\n')
    helper = tmp_path / "sub" / "helper.c"
    helper.write_text('#include "../main.c"\nstatic int g(void) { return 1; }\n')  # a cycle
    first = source_digest(main)
    assert source_digest(main) == first
    helper.write_text('#include "../main.c"\nstatic int g(void) { return 2; }\n')
    assert source_digest(main) != first


def test_system_and_missing_includes_do_not_count(tmp_path: Path) -> None:
    main = tmp_path / "main.c"
    main.write_text('#include <stdint.h>\n#include "absent.h"\nint x;\n')
    before = source_digest(main)
    (tmp_path / "stdint.h").write_text("unrelated\n")
    assert source_digest(main) == before
    (tmp_path / "absent.h").write_text("int y;\n")
    assert source_digest(main) != before
