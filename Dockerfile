# toolledger services image: the projector, reconciler, resumer and operator API all run from it.
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY toolledger ./toolledger
RUN pip install . && useradd --system --uid 10001 toolledger
USER toolledger
ENTRYPOINT ["toolledger"]
CMD ["--help"]
