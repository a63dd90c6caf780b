"""The web dashboard, served by the API at /ui (docs/dashboard.md).

session.py     signing in with an API key (an HttpOnly, SameSite cookie), CSRF checks
routes.py      the pages and their forms, under the same roles and teams as the API
views.py       what each page shows, read from Temporal and the database
charts.py      bar-chart geometry for the spend page's inline SVG
templates/     the Jinja2 pages (server-rendered; autoescaped)
static/        the stylesheet, and the one script: following a job's logs live
"""
