"""The job operations, one room per concern (admission, claiming, leases, completion,
cancellation, accounting, views), composed by :class:`job_service.services.domain.JobDomain`."""
