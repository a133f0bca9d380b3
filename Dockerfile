# toolledger server image: `toolledger server` (every server role), or any single role, from it.
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
# The example tools (docker-compose.yml's default TOOLLEDGER_TOOLS) ship in the package, as
# toolledger.examples.
COPY toolledger ./toolledger
# Your own tools (docs/production.md, "Your tools in the image"): packages to install beside
# toolledger, as pip arguments, e.g. --build-arg TOOLLEDGER_EXTRA_PACKAGES="mytools==1.2".
ARG TOOLLEDGER_EXTRA_PACKAGES=""
RUN pip install '.[server]' ${TOOLLEDGER_EXTRA_PACKAGES} && useradd --system --uid 10001 toolledger \
    && mkdir /keys && chown toolledger /keys
USER toolledger
ENTRYPOINT ["toolledger"]
CMD ["--help"]
