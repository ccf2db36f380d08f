# syntax=docker/dockerfile:1
# One image for every service; the command picks the service:
#   python -m api_gateway | job_service | credential_service | runtime_worker
#   python -m job_service migrate | python -m credential_service migrate

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY scripts ./scripts
COPY airuntime_common ./airuntime_common
COPY api_gateway ./api_gateway
COPY job_service ./job_service
COPY credential_service ./credential_service
COPY runtime_worker ./runtime_worker
# Stubs are built in the image from protos/ (grpcio-tools only in this stage).
RUN pip install grpcio-tools==1.85.1 \
 && python scripts/gen_protos.py \
 && pip install . \
 && pip uninstall -y grpcio-tools

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
RUN groupadd --system app && useradd --system --gid app --home-dir /app --shell /usr/sbin/nologin app
WORKDIR /app
COPY --from=build /opt/venv /opt/venv
COPY --from=build /src/job_service/alembic.ini /app/job_service/alembic.ini
COPY --from=build /src/credential_service/alembic.ini /app/credential_service/alembic.ini
RUN mkdir -p /app/var && chown -R app:app /app
USER app
EXPOSE 3000 50051 50052 50053
CMD ["python", "-m", "api_gateway"]
