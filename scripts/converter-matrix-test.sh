#!/usr/bin/env bash
# The converter matrix (tests/converters): tiny random models saved by transformers, converted by the real
# third-party tools at pinned versions (llama.cpp's convert_hf_to_gguf.py and gguf-py from the llama-cpp-python
# source distribution, onnxruntime-genai's builder), each artifact audited by `posenc audit` in a process of its
# own: every correct artifact must pass, every mistake made with the tools themselves must be named. The tools
# live in their own environment, .venv-converters, built once and reused while the pins (and pyproject.toml's
# dependencies) are unchanged; the source distribution is downloaded once into .cache/converters and checked
# against its sha256. A missing tool fails the run here (POSENC_REQUIRE_CONVERTERS=1); elsewhere those tests
# skip. The matrix (artifact, tool, reference, verdict, exit status, audit seconds, peak RSS) is printed at the
# end. Arguments go to pytest (`scripts/converter-matrix-test.sh -k gemma`). The workers take whole groups
# (--dist loadgroup, tests/converters/conftest.py): a module's tests together, each row of the architecture table
# (test_architectures.py) on its own, so that each checkpoint is written and converted once.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

LLAMA_CPP_PYTHON=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ORT_GENAI=0.18.0
# sentencepiece 0.2.3's sentencepiece_model_pb2 needs protobuf 7; grpcio-reflection and tritonclient cap it below 7
SENTENCEPIECE=0.2.1
VENV=.venv-converters
CACHE=.cache/converters
LLAMA_CPP=$CACHE/llama.cpp-$LLAMA_CPP_PYTHON

# The converter, its `conversion` package and gguf-py, from the pinned source distribution (76 MB, once).
sdist=$CACHE/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz
if [ ! -f "$LLAMA_CPP/convert_hf_to_gguf.py" ]; then
  mkdir -p "$CACHE"
  if [ ! -f "$sdist" ]; then
    python3 -m pip download -q --no-deps --no-binary :all: -d "$CACHE" "llama-cpp-python==$LLAMA_CPP_PYTHON"
  fi
  echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet - || {
    echo "$sdist: not the pinned llama-cpp-python $LLAMA_CPP_PYTHON (sha256 differs)" >&2; rm -f "$sdist"; exit 1; }
  top=llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
  rm -rf "$CACHE/extract" && mkdir -p "$CACHE/extract"
  tar -xzf "$sdist" -C "$CACHE/extract" "$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py"
  rm -rf "$LLAMA_CPP" && mv "$CACHE/extract/$top" "$LLAMA_CPP" && rm -rf "$CACHE/extract" "$sdist"
fi

# The environment: posenc with its test extra (torch, transformers), the builder, sentencepiece (the tiny
# tokenizers the converter reads) and the pinned gguf-py (the converter's and the audit's GGUF package).
deps=$(python3 -c 'import json, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print(json.dumps([p["dependencies"], p["optional-dependencies"]], sort_keys=True))' | sha256sum | cut -c1-16)
stamp="$VENV/.converters-$LLAMA_CPP_PYTHON-$ORT_GENAI-$SENTENCEPIECE-$deps"
if [ ! -f "$stamp" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q uv
  links=()
  for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true); do
    links+=(--find-links "$dir")
  done
  "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" "${links[@]}" -e '.[test]' \
    "onnxruntime-genai==$ORT_GENAI" "sentencepiece==$SENTENCEPIECE" "$LLAMA_CPP/gguf-py"
  touch "$stamp"
fi

export POSENC_REQUIRE_CONVERTERS=1 POSENC_LLAMA_CPP="$PWD/$LLAMA_CPP"
export POSENC_CONVERTER_MATRIX_REPORT=${POSENC_CONVERTER_MATRIX_REPORT:-$CACHE/matrix.md}
rm -f "$POSENC_CONVERTER_MATRIX_REPORT"
status=0
timeout 2000 "$VENV/bin/python" -m pytest -m converters -p no:cacheprovider -q -n auto --dist loadgroup \
  tests/converters "$@" || status=$?
[ -f "$POSENC_CONVERTER_MATRIX_REPORT" ] && cat "$POSENC_CONVERTER_MATRIX_REPORT"
exit "$status"
