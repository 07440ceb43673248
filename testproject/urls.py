"""URLs of the shop: the admin (with the invoices' "Export now" view)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
