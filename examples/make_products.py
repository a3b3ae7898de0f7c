"""Write the example product tables: 500 products each, from a fixed seed (same file on every machine)."""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

EN = {
    "kinds": ["Wireless Earbuds", "Smart Watch", "Desk Lamp", "Travel Backpack", "Coffee Grinder", "Yoga Mat",
              "Water Bottle", "Bluetooth Speaker", "Electric Kettle", "Running Shoes", "Phone Stand", "Air Purifier",
              "Mechanical Keyboard", "Rain Jacket", "Camping Stove", "Baby Monitor", "Hair Dryer", "Power Bank",
              "Notebook", "Sunglasses"],
    "brands": ["Nova", "Peak", "Aria", "Lumo", "Vera", "Orbit", "Kite", "Pulse", "Sol", "Tide", "Zen", "Echo",
               "Flux", "Haven", "Ember", "Drift", "Cove", "Brisk", "Halo", "Terra", "Quill", "Rook", "Mosa"],
    "features": ["40-hour battery life", "active noise cancelling", "waterproof to 50 meters", "weighs only 200 grams",
                 "charges fully in 30 minutes", "made from recycled materials", "whisper-quiet motor",
                 "adjustable color temperature", "fits a 16-inch laptop", "two-year warranty", "folds flat for travel",
                 "keeps drinks cold for 24 hours", "non-slip natural rubber", "one-touch setup with the app"],
    "audiences": ["commuters", "runners", "students", "new parents", "remote workers", "hikers", "coffee lovers",
                  "frequent travelers", "gamers", "yoga beginners", "busy professionals", "seniors"],
}
ZH = {
    "kinds": ["无线降噪耳机", "智能手环", "护眼台灯", "旅行背包", "咖啡研磨机", "瑜伽垫", "保温杯", "蓝牙音箱",
              "电热水壶", "跑步鞋", "空气净化器", "机械键盘", "充电宝", "婴儿监视器"],
    "brands": ["星辰", "山峰", "清风", "明月", "极光", "青禾", "云朵", "海潮", "晨曦", "松果"],
    "features": ["40小时续航，主动降噪", "血氧监测，14天续航", "无频闪护眼", "防泼水面料", "一键研磨",
                 "天然橡胶防滑", "24小时保冷", "360度环绕音效", "五分钟快速烧开", "轻量缓震"],
    "audiences": ["通勤族", "运动爱好者", "学生", "新手父母", "上班族", "户外爱好者", "咖啡爱好者", "游戏玩家"],
}


def products(table: dict, count: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < count:
        name = f"{rng.choice(table['brands'])} {rng.choice(table['kinds'])}"
        if table is ZH:
            name = name.replace(" ", "")
        if name in seen:
            name = f"{name} {len(rows) + 1}"
        seen.add(name)
        rows.append({
            "product_id": f"p{len(rows) + 1:05d}",
            "name": name,
            "feature": rng.choice(table["features"]),
            "audience": rng.choice(table["audiences"]),
        })
    return rows


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    """Write product rows as UTF-8 CSV with a header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for filename, table in (("products.csv", EN), ("products_zh.csv", ZH)):
        path = write_csv(args.out / filename, products(table, args.count, args.seed))
        print(f"wrote {args.count} products to {path}")


if __name__ == "__main__":
    main()
