# The rendezvous server (rendezvous/, standard library only) for the Fargate service of
# infra/aws. Built by `cdk deploy` from the context packaging.rendezvous_image_context()
# stages (the rendezvous package and this file); `cdk synth` only stages it.
FROM public.ecr.aws/docker/library/python:3.11-slim
WORKDIR /app
COPY rendezvous /app/rendezvous
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER nobody
EXPOSE 7300
# The signing secret comes from SKYFN_RENDEZVOUS_SECRET (an ECS secret from Secrets Manager).
ENTRYPOINT ["python", "-m", "rendezvous", "--host", "0.0.0.0"]
CMD ["--port", "7300"]
