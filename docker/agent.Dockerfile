# llmgw-agent: one image per role. Build from the repository root:
#   docker build -f docker/agent.Dockerfile -t llmgw-agent .
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY libs/common libs/common
COPY services/agent services/agent
# [nvml]: on a GPU node the agent reports the GPUs NVML sees (services/agent gpus.py).
RUN pip install ./libs/common "./services/agent[nvml]" && rm -rf /src
RUN useradd --system --uid 10001 llmgw
USER llmgw
ENTRYPOINT ["llmgw-agent"]
CMD ["--config", "/etc/llmgw/agent.yaml"]
