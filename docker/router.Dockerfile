# llmgw-router: one image per role. Build from the repository root:
#   docker build -f docker/router.Dockerfile -t llmgw-router .
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY libs/common libs/common
COPY services/router services/router
RUN pip install ./libs/common ./services/router && rm -rf /src
RUN useradd --system --uid 10001 llmgw
USER llmgw
ENTRYPOINT ["llmgw-router"]
CMD ["--config", "/etc/llmgw/router.yaml"]
