# llmgw-router: one image per role. Build from the repository root:
#   docker build -f docker/router.Dockerfile -t llmgw-router .
# The router's wire modules are compiled with Cython (services/router/setup.py): built as wheels in a
# stage that has a C compiler, installed in the slim one that has none.
FROM python:3.11 AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY libs/common libs/common
COPY services/router services/router
RUN pip wheel --no-deps -w /wheels ./libs/common ./services/router

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels
RUN useradd --system --uid 10001 llmgw
USER llmgw
ENTRYPOINT ["llmgw-router"]
CMD ["--config", "/etc/llmgw/router.yaml"]
