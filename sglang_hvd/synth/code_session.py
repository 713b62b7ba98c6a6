"""synth-code: adding REST handlers to a codebase, one resource per turn.

Every handler follows the same boilerplate (decorator, signature, docstring, lookup,
404, response model) with different names and fields: the cache drafter can copy the
skeleton from earlier answers and must stop at every name.
"""

from __future__ import annotations

import random
from typing import Any

from .common import assistant

SOURCE = "synth-code"

RESOURCES = ["invoice", "customer", "shipment", "product", "ticket", "coupon",
             "warehouse", "review", "supplier", "refund", "session", "webhook"]
FIELDS = ["name", "status", "amount", "email", "created_at", "owner_id",
          "quantity", "sku", "priority", "region", "note", "currency"]
TYPES = {"name": "str", "status": "str", "amount": "float", "email": "str", "created_at": "datetime", "owner_id": "int",
         "quantity": "int", "sku": "str", "priority": "int", "region": "str", "note": "str | None", "currency": "str"}


def _model(resource: str, fields: list[str]) -> str:
    cls = resource.capitalize()
    lines = [f"class {cls}Out(BaseModel):", "    id: int"] + [f"    {f}: {TYPES[f]}" for f in fields]
    lines += ["", "    model_config = ConfigDict(from_attributes=True)"]
    return "\n".join(lines)


def _handlers(resource: str, ops: list[str]) -> str:
    cls = resource.capitalize()
    out = []
    if "get" in ops:
        out.append(f'''@router.get("/{resource}s/{{item_id}}", response_model={cls}Out)
async def get_{resource}(item_id: int, db: Session = Depends(get_db)) -> {cls}Out:
    """Return one {resource} by id, or 404 if it does not exist."""
    item = db.get({cls}, item_id)
    if item is None:
        raise HTTPException(status_code=404, detail="{resource} not found")
    return {cls}Out.model_validate(item)''')
    if "list" in ops:
        out.append(f'''@router.get("/{resource}s", response_model=list[{cls}Out])
async def list_{resource}s(limit: int = 50, offset: int = 0, db: Session = Depends(get_db)) -> list[{cls}Out]:
    """Return a page of {resource}s, newest first."""
    rows = db.query({cls}).order_by({cls}.id.desc()).offset(offset).limit(limit).all()
    return [{cls}Out.model_validate(row) for row in rows]''')
    if "delete" in ops:
        out.append(f'''@router.delete("/{resource}s/{{item_id}}", status_code=204)
async def delete_{resource}(item_id: int, db: Session = Depends(get_db)) -> None:
    """Delete one {resource}; 404 if it does not exist."""
    item = db.get({cls}, item_id)
    if item is None:
        raise HTTPException(status_code=404, detail="{resource} not found")
    db.delete(item)
    db.commit()''')
    return "\n\n\n".join(out)


def session(rng: random.Random, index: int) -> dict[str, Any]:
    resources = rng.sample(RESOURCES, rng.randint(3, 6))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a senior Python engineer working on a FastAPI service. "
                                      "Answer with code in a ```python block and a one-line explanation."},
    ]
    for i, resource in enumerate(resources):
        fields = rng.sample(FIELDS, rng.randint(2, 5))
        ops = [op for op in ("get", "list", "delete") if rng.random() < 0.8] or ["get"]
        ask = f"Add {', '.join(ops)} endpoints for {resource}s with fields {', '.join(fields)}."
        if i == 0:
            ask = "We use SQLAlchemy models and pydantic v2 response models. " + ask
        messages.append({"role": "user", "content": ask})
        code = _model(resource, fields) + "\n\n\n" + _handlers(resource, ops)
        messages.append(assistant(f"```python\n{code}\n```\nThis adds the {resource.capitalize()}Out model "
                                  f"and the {', '.join(ops)} handlers for {resource}s."))
    return {"id": f"{SOURCE}/{index:04d}", "source": SOURCE, "model": "synthetic", "license": "Apache-2.0",
            "messages": messages}
