# One image for every Python component of CooRM: the four services, the accounting Celery worker and beat,
# node agents, and the command line (coorm status, submit, usage...). docker-compose.yml picks the part with
# the command: `coorm service policy-engine`, `coorm agent --cluster c0 --nodes c0n0..c0n7`, `coorm celery
# worker`... Configuration comes from COORM_* variables (.env.example).

# ---- build: a wheel of the project ------------------------------------------------------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# coorm/ holds links to the folders the design names (coorm/services -> ../services...): copy both
COPY shared ./shared
COPY services ./services
COPY launchers ./launchers
COPY node_agent ./node_agent
COPY coorm ./coorm
# the coorm command (a script file: see bin/coorm)
COPY bin ./bin
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- run: the wheel and its dependencies, as an unprivileged user ------------------------------------------
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 coorm \
    && useradd --system --uid 10001 --gid coorm --home-dir /home/coorm --create-home --shell /usr/sbin/nologin coorm
COPY --from=build /wheels /wheels
RUN pip install "$(ls /wheels/*.whl)[server]" && rm -rf /wheels
USER coorm
WORKDIR /home/coorm
# services and agents serve their Prometheus metrics here when COORM_METRICS_PORT=9100 (compose sets it)
EXPOSE 9100
ENTRYPOINT ["coorm"]
CMD ["--help"]
