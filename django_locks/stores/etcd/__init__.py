"""The etcd store (extra ``etcd``: ``pip install django-distributed-locks[etcd]``)."""

from django_locks.stores.etcd.store import EtcdStore

__all__ = ["EtcdStore"]
