"""The services an adapter talks to: oracle, catalog, storage, and one compute process per
cluster it knows an address for (``--compute default=HOST:PORT,other=HOST:PORT``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.adapter.sql.errors import SqlError
from tidemark.clients.catalog import CatalogClient
from tidemark.clients.compute import ComputeClient
from tidemark.clients.oracle import OracleClient
from tidemark.clients.storage import StorageClient
from tidemark.rpc.tls import TlsSettings

UNDEFINED_OBJECT = "42704"


def parse_compute_endpoints(text: str) -> dict[str, str]:
    """``{"default": "HOST:PORT", ...}`` from ``default=HOST:PORT[,name=HOST:PORT]``."""
    endpoints: dict[str, str] = {}
    for part in text.split(","):
        entry = part.strip()
        if not entry:
            continue
        name, sep, address = entry.partition("=")
        name, address = name.strip(), address.strip()
        if not sep or not name or not address:
            raise ValueError(f"{entry!r} is not NAME=HOST:PORT")
        if name in endpoints:
            raise ValueError(f"cluster {name!r} is given twice")
        endpoints[name] = address
    return endpoints


@dataclass
class Backends:
    oracle: OracleClient
    catalog: CatalogClient
    storage: StorageClient
    compute: dict[str, ComputeClient] = field(default_factory=dict)

    @classmethod
    def connect(
        cls,
        oracle: str,
        catalog: str,
        storage: str,
        compute: dict[str, str],
        tls: TlsSettings | None = None,
    ) -> Backends:
        """Clients of every service; over mTLS with the adapter's own certificate when
        ``tls`` is given."""
        return cls(
            OracleClient(oracle, tls=tls),
            CatalogClient(catalog, tls=tls),
            StorageClient(storage, tls=tls),
            {name: ComputeClient(address, tls=tls) for name, address in compute.items()},
        )

    def compute_for(self, cluster: str, position: int = 0) -> ComputeClient:
        client = self.compute.get(cluster)
        if client is None:
            known = ", ".join(sorted(self.compute)) or "none"
            raise SqlError(
                UNDEFINED_OBJECT,
                f'this adapter has no compute endpoint for cluster "{cluster}" (it knows: {known})',
                position,
                hint=f"start a compute process for it and pass --compute {cluster}=HOST:PORT "
                "to the adapter, or SET cluster to one it knows",
            )
        return client

    async def close(self) -> None:
        for client in self.compute.values():
            await client.close()
        await self.storage.close()
        await self.catalog.close()
        await self.oracle.close()
