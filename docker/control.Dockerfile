# llmgw-control: one image per role. Build from the repository root:
#   docker build -f docker/control.Dockerfile -t llmgw-control .
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY libs/common libs/common
COPY services/control services/control
RUN pip install ./libs/common ./services/control && rm -rf /src
RUN useradd --system --uid 10001 llmgw
USER llmgw
ENTRYPOINT ["llmgw-control"]
CMD ["--config", "/etc/llmgw/control.yaml"]
