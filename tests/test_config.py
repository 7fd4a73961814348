"""Settings from environment variables (atensor/config.py): sizes with suffixes are read, and a value that
is not a number is an error at import naming the variable, not a bare int() traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from atensor.config import env_number


def _import_with(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "import atensor; s = atensor.settings; print(s.blas_parallel_flops, s.allreduce_bucket_bytes, s.net_timeout_s)"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("text, value", [("8388608", 8388608), ("8Mi", 8 << 20), ("64M", 64_000_000),
                                         ("2 Ki", 2048), ("1.5Ki", 1536), ("3g", 3_000_000_000)])
def test_sizes_take_decimal_and_binary_suffixes(monkeypatch, text, value):
    monkeypatch.setenv("ATENSOR_TEST_SIZE", text)
    assert env_number("ATENSOR_TEST_SIZE", "1", sizes=True) == value


def test_an_unset_variable_gives_its_default(monkeypatch):
    monkeypatch.delenv("ATENSOR_TEST_SIZE", raising=False)
    assert env_number("ATENSOR_TEST_SIZE", "25Mi", sizes=True) == 25 << 20
    assert env_number("ATENSOR_TEST_SIZE", "300", kind=float) == 300.0


@pytest.mark.parametrize("text", ["8MB", "lots", "", "1.5"])
def test_a_value_that_is_not_a_number_names_the_variable_and_the_forms(monkeypatch, text):
    monkeypatch.setenv("ATENSOR_TEST_SIZE", text)
    with pytest.raises(ValueError, match=r"ATENSOR_TEST_SIZE=.*(not an integer|not a whole number)"):
        env_number("ATENSOR_TEST_SIZE", "1")


def test_the_settings_read_suffixed_values_at_import():
    got = _import_with({"ATENSOR_BLAS_PARALLEL_FLOPS": "8Mi", "ATENSOR_BUCKET_BYTES": "1Mi",
                        "ATENSOR_NET_TIMEOUT": "2.5"})
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(8 << 20), str(1 << 20), "2.5"]


def test_a_bad_setting_fails_the_import_with_a_clear_message():
    got = _import_with({"ATENSOR_BLAS_PARALLEL_FLOPS": "8MB"})
    assert got.returncode != 0
    last = got.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: environment variable ATENSOR_BLAS_PARALLEL_FLOPS='8MB'"), last
    assert "Ki, Mi, Gi" in last
