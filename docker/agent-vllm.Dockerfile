# llmgw-agent-vllm: the agent with vLLM in its own environment (/opt/vllm), for
# GPU nodes (deploy/k8s/overlays/production/config/agent.yaml points
# engines.vllm.python there). Build from the repository root:
#   docker build -f docker/agent-vllm.Dockerfile -t llmgw-agent-vllm .
# vLLM's wheels carry the CUDA runtime; the driver comes from the node through
# NVIDIA's container toolkit. Triton compiles small launchers when an engine
# starts, so a C compiler stays in the image.
FROM python:3.11-slim
ARG VLLM_VERSION=0.32.0
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# The engine's environment apart from the agent's, as on any llmgw node
# (docs/vllm.md): neither's dependencies move the other's.
RUN python -m venv /opt/vllm && /opt/vllm/bin/pip install "vllm==${VLLM_VERSION}"
WORKDIR /src
COPY libs/common libs/common
COPY services/agent services/agent
RUN pip install ./libs/common "./services/agent[nvml]" && rm -rf /src
RUN useradd --system --uid 10001 llmgw
USER llmgw
ENTRYPOINT ["llmgw-agent"]
CMD ["--config", "/etc/llmgw/agent.yaml"]
