"""A small real HTTP API with its own OpenAPI document (FastAPI, 3.1), for the
openapi upstream: path, query, header and body parameters, an error status, a
large response, a `$ref`-heavy and recursive schema, and an echo of what the
gateway sent. Run: python openapi_service.py PORT
"""

from __future__ import annotations

import sys
from typing import Annotated

import uvicorn
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

app = FastAPI(title="Shop", version="1.0")


class Address(BaseModel):
    street: str
    city: str


class Owner(BaseModel):
    name: str
    address: Address


class Tag(BaseModel):
    label: str


class Category(BaseModel):
    """Categories nest: a recursive schema."""

    name: str
    children: list[Category] = []


class Item(BaseModel):
    name: str
    price: float
    owner: Owner
    tags: list[Tag] = []
    category: Category | None = None


class Stored(Item):
    id: int


ITEMS: dict[int, Stored] = {}
# How many times each operation ran, so a test can show a refused call never arrived.
RAN: dict[str, int] = {}


def ran(operation: str) -> None:
    RAN[operation] = RAN.get(operation, 0) + 1


@app.get("/items/{item_id}", operation_id="get_item", summary="Read one item")
def get_item(
    item_id: int,
    verbose: bool = False,
    x_request_id: Annotated[str | None, Header()] = None,
) -> dict:
    ran("get_item")
    return {"id": item_id, "verbose": verbose, "request_id": x_request_id}


@app.post("/items", operation_id="create_item", status_code=201, summary="Create an item")
def create_item(item: Item) -> Stored:
    ran("create_item")
    stored = Stored(id=len(ITEMS) + 1, **item.model_dump())
    ITEMS[stored.id] = stored
    return stored


@app.put("/items/{item_id}", operation_id="replace_item", summary="Replace an item")
def replace_item(item_id: int, item: Item) -> Stored:
    ran("replace_item")
    if item_id not in ITEMS:
        raise HTTPException(status_code=404, detail=f"no item {item_id}")
    ITEMS[item_id] = Stored(id=item_id, **item.model_dump())
    return ITEMS[item_id]


@app.delete("/items/{item_id}", operation_id="delete_item", summary="Delete an item")
def delete_item(item_id: int) -> dict:
    ran("delete_item")
    if ITEMS.pop(item_id, None) is None:
        raise HTTPException(status_code=404, detail=f"no item {item_id}")
    return {"deleted": item_id}


@app.get("/files/{name:path}", summary="The raw path the request arrived with")
def read_file(name: str, request: Request) -> dict:
    ran("read_file")
    return {"name": name, "raw_path": request.scope["raw_path"].decode()}


@app.get("/large", operation_id="large", response_class=PlainTextResponse)
def large(size: Annotated[int, Query(ge=0, le=10_000_000)] = 100_000) -> str:
    return "x" * size


@app.get("/echo", operation_id="echo", summary="What the gateway sent")
def echo(request: Request) -> dict:
    return {
        "query": dict(request.query_params),
        "authorization": request.headers.get("authorization"),
        "x_api_key": request.headers.get("x-api-key"),
        "cookie": request.headers.get("cookie"),
    }


@app.get("/ran", operation_id="ran", summary="How many times each operation ran")
def ran_counts() -> dict:
    return dict(RAN)


@app.post("/revise", include_in_schema=False)
def revise() -> dict:
    """Changes get_item's summary in the served document, as a new release would."""
    for route in app.routes:
        if getattr(route, "operation_id", None) == "get_item":
            route.summary = "Read one item, with its history"
    app.openapi_schema = None
    return {"revised": True}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
