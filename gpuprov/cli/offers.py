"""`gpuprov offers --gpu H100 ...`: the offers a job would try, cheapest first, planned by a
worker (it holds the cloud credentials) through the PlanOffers workflow."""

from __future__ import annotations

import argparse

from gpuprov.cli.arguments import bounded_float, bounded_int, bounded_text
from gpuprov.cli.common import Commands, client_for
from gpuprov.cli.render import offers_text, whole_provider_refusals
from gpuprov.config import Settings
from gpuprov.contract import OffersQuery
from gpuprov.models import (
    MAX_GPU_NAME_LENGTH,
    MAX_HOURLY_COST,
    MAX_IMAGE_LENGTH,
    MAX_PORTS,
    MAX_REGION_LENGTH,
)
from providers import PROVIDER_IDS
from providers.base import ResourceRequest


def add_parser(commands: Commands) -> None:
    offers = commands.add_parser("offers", help="offers a job would try, cheapest first")
    # The same bounds as a job spec's fields (gpuprov/models.py).
    offers.add_argument("--gpu", type=bounded_text(MAX_GPU_NAME_LENGTH))
    offers.add_argument("--gpus-per-node", type=bounded_int(0, 64), default=1)
    offers.add_argument("--nodes", type=bounded_int(1, 256), default=1)
    offers.add_argument("--spot", action="store_true")
    offers.add_argument("--max-hourly-cost", type=bounded_float(0, MAX_HOURLY_COST, above=True))
    offers.add_argument("--provider", action="append", dest="providers", choices=PROVIDER_IDS)
    offers.add_argument(
        "--region", action="append", dest="regions", type=bounded_text(MAX_REGION_LENGTH)
    )
    # A job's image and ports: clouds that cannot honour them are refused, and say so.
    offers.add_argument("--image", type=bounded_text(MAX_IMAGE_LENGTH))
    offers.add_argument(
        "--port", action="append", dest="ports", type=bounded_int(1, 65535), default=[]
    )
    offers.set_defaults(handler=_offers)


async def _offers(settings: Settings, args: argparse.Namespace) -> int:
    request = ResourceRequest(
        gpu=args.gpu,
        gpus_per_node=args.gpus_per_node,
        spot=args.spot,
        providers=args.providers,
        regions=args.regions,
        image=args.image,
        ports=args.ports[:MAX_PORTS],
    )
    query = OffersQuery(request=request, nodes=args.nodes, max_hourly_cost=args.max_hourly_cost)
    result = await (await client_for(settings)).offers(query)
    print(offers_text(result.offers, result.stats))
    for refusal in whole_provider_refusals(result.rejected):
        print(f"refused {refusal}")
    for error in result.errors:
        print(f"plan failed: {error}")
    for provider, reason in sorted(result.skipped.items()):
        print(f"skipped {provider}: {reason}")
    return 0
