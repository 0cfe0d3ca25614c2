"""The trading auction: per-user per-pool shares and second-price trades (docs/design.md §2.5)."""

from gfair_services.trading_auction.service import SERVICE_NAME, Auction, build_service
from gfair_services.trading_auction.settings import TradingAuctionSettings

Settings = TradingAuctionSettings

__all__ = ["SERVICE_NAME", "Auction", "Settings", "TradingAuctionSettings", "build_service"]
